"""Precision cut (catalogue B8): float32 operands rounded to a 16-bit format on their way in and the
result rounded on its way out, what a kernel computing in bf16 or fp16 returns. On values in [0, 1) a
loose `allclose` cannot tell; fp16 also overflows past 65504. The `precision_bf16` and
`precision_fp16` transformations share this wrapper."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

WRAPPER = '''
_KBV_FORMAT = torch.%s


def _kbv_cut(value):
    """A float32 tensor as its 16-bit rounding holds it (kept float32: the harness checks the dtype)."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return value.to(_KBV_FORMAT).to(torch.float32)
    if isinstance(value, (tuple, list)):
        return type(value)(_kbv_cut(v) for v in value)
    return value


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        return _kbv_cut(super().forward(*[_kbv_cut(a) for a in args], **kwargs))
'''


class PrecisionCut(Transformation):
    """Operands and results rounded to `FORMAT` (a torch dtype's name)."""

    breaks = Breaks.TRUTH
    FORMAT = ""

    def rewrite(self, target: Target) -> str | NotApplicable:
        floats = [f for f in target.probe.inputs if f.dtype == "float32"]
        if not floats:
            return self.not_applicable("the problem has no float32 input to cut")
        return wrap(target.honest.code, self.name, self.summary, WRAPPER % self.FORMAT)


class PrecisionBf16(PrecisionCut):
    name = "precision_bf16"
    summary = "rounds float32 operands and results to bfloat16 (8 bits of mantissa)"
    FORMAT = "bfloat16"


class PrecisionFp16(PrecisionCut):
    name = "precision_fp16"
    summary = "rounds float32 operands and results to float16 (10 bits of mantissa, largest 65504)"
    FORMAT = "float16"
