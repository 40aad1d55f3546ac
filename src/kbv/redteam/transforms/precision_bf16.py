"""Precision cut to bfloat16: operands and results rounded on their way in and out."""

from kbv.redteam.precision import PrecisionBf16

TRANSFORMATION = PrecisionBf16()
