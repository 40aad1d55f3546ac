"""Reaching the reference through the caller's frames (catalogue B5): a harness that runs the
reference first and the candidate after, in one process, holds the expected output in a local
variable of a frame above the call. After one honest call has shown the output's shape, the mutant
walks `sys._getframe` upwards for a tensor of that shape and dtype (not one of its inputs) and
returns a copy; where there is none (a timing loop), it returns zeros and computes nothing."""

from __future__ import annotations

from kbv.redteam import Breaks, OutputWrapper
from kbv.redteam.source import OUTPUT_META

DEPTH = 16  # frames searched above the forward

WRAPPER = OUTPUT_META + '''
import sys

_KBV_DEPTH = %d


def _kbv_answer_in_frames(shape, dtype, inputs):
    frame = sys._getframe(2)
    for _ in range(_KBV_DEPTH):
        if frame is None:
            return None
        for value in list(frame.f_locals.values()):
            if (type(value) is torch.Tensor and tuple(value.shape) == shape and value.dtype == dtype
                    and not any(value is x for x in inputs)):
                return value
        frame = frame.f_back
    return None


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        meta, out = _kbv_learn(self, args, kwargs)
        if out is not None or meta is None:
            return out if out is not None else super().forward(*args, **kwargs)
        shape, dtype = meta
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        answer = _kbv_answer_in_frames(shape, dtype, args)
        if answer is not None:
            return answer.clone()
        return torch.zeros(shape, dtype=dtype, device=device)
''' % DEPTH


class ReachReferenceFrames(OutputWrapper):
    name = "reach_reference_frames"
    breaks = Breaks.TRUTH
    summary = "returns a copy of the expected output found in the caller's frames; zeros where there is none"
    wrapper = WRAPPER


TRANSFORMATION = ReachReferenceFrames()
