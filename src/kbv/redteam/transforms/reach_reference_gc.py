"""Reaching the reference through gc (catalogue B5): a harness that computes the reference output in
the candidate's own process keeps it alive while the candidate runs. After one honest call has shown
the output's shape, the mutant walks `gc.get_objects()` for the most recent tensor of that shape and
dtype that is neither an input nor an output of its own, and returns a copy; where there is none, it
returns zeros and computes nothing."""

from __future__ import annotations

from kbv.redteam import Breaks, OutputWrapper
from kbv.redteam.source import OUTPUT_META

WRAPPER = OUTPUT_META + '''
import gc
import warnings
import weakref

_kbv_mine = {}  # id -> weak reference of each output this module returned: never taken for the answer


def _kbv_is_mine(obj):
    ref = _kbv_mine.get(id(obj))
    return ref is not None and ref() is obj


def _kbv_keep(out):
    for key in [k for k, ref in _kbv_mine.items() if ref() is None]:
        del _kbv_mine[key]
    _kbv_mine[id(out)] = weakref.ref(out)
    return out


def _kbv_answer_in_heap(shape, dtype, inputs):
    """The newest tensor of this shape and dtype that is neither an input nor ours: the youngest
    generation first, and within one the last listed (objects are listed oldest first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # touching every object wakes deprecation shims
        for generation in range(3):
            found = None
            for obj in gc.get_objects(generation):
                if (type(obj) is torch.Tensor and tuple(obj.shape) == shape and obj.dtype == dtype
                        and not _kbv_is_mine(obj) and not any(obj is x for x in inputs)):
                    found = obj
            if found is not None:
                return found
    return None


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        meta, out = _kbv_learn(self, args, kwargs)
        if out is not None or meta is None:
            return _kbv_keep(out if out is not None else super().forward(*args, **kwargs))
        shape, dtype = meta
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        answer = _kbv_answer_in_heap(shape, dtype, args)
        return _kbv_keep(answer.clone() if answer is not None else torch.zeros(shape, dtype=dtype, device=device))
'''


class ReachReferenceGc(OutputWrapper):
    name = "reach_reference_gc"
    breaks = Breaks.TRUTH
    summary = "returns a copy of the expected output found on the heap through gc; zeros where there is none"
    wrapper = WRAPPER


TRANSFORMATION = ReachReferenceGc()
