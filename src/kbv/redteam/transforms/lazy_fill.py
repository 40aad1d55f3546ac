"""Lazy output, as a deferred fill (catalogue A3, A6): after one honest call has shown the output's
shape, every call returns a plain, empty tensor at once and leaves the work pending; the reads and
waits a harness does before it compares (`torch.allclose`, `Tensor.detach`, `Tensor.cpu`,
`torch.cuda.synchronize`, ...) are wrapped to do the latest pending work first. A timing loop that
never reads its outputs times an allocation; only the last call's work is ever done."""

from __future__ import annotations

from kbv.redteam import Breaks, OutputWrapper
from kbv.redteam.source import OUTPUT_META, READ_HOOKS

WRAPPER = OUTPUT_META + READ_HOOKS + '''

_kbv_pending = []  # the latest call's work: an older call's output is never read, so never filled


def _kbv_settle():
    while _kbv_pending:
        work = _kbv_pending.pop()
        _kbv_local.inside = True
        try:
            work()
        finally:
            _kbv_local.inside = False


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        meta, out = _kbv_learn(self, args, kwargs)
        if out is not None or meta is None:
            return out if out is not None else super().forward(*args, **kwargs)
        shape, dtype = meta
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        empty = torch.empty(shape, dtype=dtype, device=device)

        def fill():
            empty.copy_(_KbvHonest.forward(self, *args, **kwargs))

        _kbv_pending[:] = [fill]
        return empty
'''


class LazyFill(OutputWrapper):
    name = "lazy_fill"
    breaks = Breaks.SPEED
    summary = "returns an empty plain tensor and fills it only when the harness reads or synchronises"
    wrapper = WRAPPER


TRANSFORMATION = LazyFill()
