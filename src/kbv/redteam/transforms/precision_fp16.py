"""Precision cut to float16: operands and results rounded on their way in and out."""

from kbv.redteam.precision import PrecisionFp16

TRANSFORMATION = PrecisionFp16()
