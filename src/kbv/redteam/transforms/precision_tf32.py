"""TF32 forced (catalogue B8): at import the mutant turns TF32 on for matmuls and convolutions
(`allow_tf32`, float32 matmul precision "high") for the whole process, and a Triton `tl.dot` asked
for IEEE float32 is asked for TF32 instead. Where the honest kernel has no such dot, the forward runs
the problem's own PyTorch code, whose library matmuls and convolutions the flags now speed up: a
harness whose baseline runs strict float32 (KernelBench's) reports the tensor cores' 7x as the
candidate's. CUDA only: TF32 is a tensor-core format."""

from __future__ import annotations

import re

from kbv.candidates import Backend
from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import embed_problem, wrap

_IEEE_DOT_RE = re.compile(r"""input_precision\s*=\s*(["'])ieee\1""")

FLAGS = '''
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.set_float32_matmul_precision("high")
'''

KERNEL_WRAPPER = FLAGS + '''

class ModelNew(_KbvHonest):
    """The honest candidate, its dots in TF32."""
'''

LIBRARY_WRAPPER = FLAGS + '''

class ModelNew(_KbvHonest):
    def __init__(self, *args, **kwargs):
        library = _kbv_build_library(args, kwargs)
        super().__init__(*args, **kwargs)
        self.__dict__["_kbv_library_model"] = library  # kept out of the module's own state

    def forward(self, *args, **kwargs):
        return _kbv_library(self, *args)
'''


class PrecisionTf32(Transformation):
    name = "precision_tf32"
    breaks = Breaks.SPEED
    summary = "forces TF32 for every float32 matmul and convolution (and Triton dot) of the process"
    backends = frozenset({Backend.CUDA, Backend.TRITON, Backend.TORCH})
    devices = frozenset({"cuda"})

    def rewrite(self, target: Target) -> str | NotApplicable:
        code = target.honest.code
        if _IEEE_DOT_RE.search(code):
            code = _IEEE_DOT_RE.sub(r"input_precision=\1tf32\1", code)
            return wrap(code, self.name, self.summary, KERNEL_WRAPPER)
        if not target.probe.linear_algebra:
            return self.not_applicable("the problem runs no matmul or convolution, and the candidate no IEEE dot")
        return wrap(code, self.name, self.summary, embed_problem(target.problem) + LIBRARY_WRAPPER)


TRANSFORMATION = PrecisionTf32()
