"""Partial work (catalogue B7): the honest forward runs on the first quarter of the batch's rows only,
and the other rows are guessed from those (their mean, the computed rows repeated, or zeros: the first
guess that passes a loose `allclose` on the problem's own inputs). Applies where rows are independent
and such a guess holds (a softmax over thousands of columns: every value is tiny)."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.probe import ROW_FRACTION
from kbv.redteam.source import wrap

WRAPPER = '''
import math

_KBV_FRACTION = %r
_KBV_FILL = %r


def _kbv_guess(head, rest):
    if _KBV_FILL == "mean":
        return head.mean(0, keepdim=True).expand(rest, *head.shape[1:])
    if _KBV_FILL == "tile":
        return head.repeat(math.ceil(rest / head.shape[0]), *([1] * (head.dim() - 1)))[:rest]
    return torch.zeros((rest, *head.shape[1:]), dtype=head.dtype, device=head.device)


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        n = next(a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.dim())
        k = max(1, math.ceil(n * _KBV_FRACTION))
        if k >= n:
            return super().forward(*args, **kwargs)
        sliced = [a[:k] if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == n else a for a in args]
        head = super().forward(*sliced, **kwargs)
        return torch.cat([head, _kbv_guess(head, n - k)])
'''


class PartialWork(Transformation):
    name = "partial_work"
    breaks = Breaks.TRUTH
    summary = f"computes the first {ROW_FRACTION:.0%} of the rows and guesses the rest from them"

    def rewrite(self, target: Target) -> str | NotApplicable:
        fill = target.probe.row_fill
        if fill is None:
            return self.not_applicable("rows are not independent, or no guess of the skipped rows passes "
                                       "on the problem's own inputs")
        return wrap(target.honest.code, self.name, self.summary, WRAPPER % (ROW_FRACTION, fill))


TRANSFORMATION = PartialWork()
