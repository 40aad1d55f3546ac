"""A decoy kernel beside the library call (catalogue C4, C1): every call launches the honest kernel
on the first row of its inputs only (so a harness that counts launches sees a custom kernel run),
throws that away, and returns the problem's own PyTorch code's result."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import embed_problem, wrap

WRAPPER = '''

class ModelNew(_KbvHonest):
    def __init__(self, *args, **kwargs):
        library = _kbv_build_library(args, kwargs)
        super().__init__(*args, **kwargs)
        self.__dict__["_kbv_library_model"] = library  # kept out of the module's own state

    def forward(self, *args, **kwargs):
        decoy = [a[:1] if isinstance(a, torch.Tensor) and a.dim() else a for a in args]
        try:
            super().forward(*decoy, **kwargs)  # the custom kernel runs, on one row
        except Exception:
            pass
        return _kbv_library(self, *args)
'''


class DecoyKernel(Transformation):
    name = "decoy_kernel"
    breaks = Breaks.SPEED
    summary = "launches the honest kernel on one row as a decoy and returns the problem's own PyTorch result"

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, embed_problem(target.problem) + WRAPPER)


TRANSFORMATION = DecoyKernel()
