"""Comparing candidate outputs with reference outputs. Pure functions of tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kbv.verdict import Category


@dataclass(frozen=True)
class Comparison:
    passed: bool
    category: Category | None = None
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    max_rel_err: float | None = None
    note: str = ""


def compare_allclose(reference: torch.Tensor, output: torch.Tensor, atol: float, rtol: float) -> Comparison:
    """KernelBench's check: exact shape, then `torch.allclose(atol, rtol)` (NaN never equal).

    A dtype or device mismatch fails (KernelBench's allclose raises there and scores the trial wrong).
    """
    if tuple(output.shape) != tuple(reference.shape):
        return Comparison(False, Category.SHAPE_MISMATCH,
                          note=f"shape {tuple(output.shape)} != {tuple(reference.shape)}")
    if output.dtype != reference.dtype:
        return Comparison(False, Category.DTYPE_MISMATCH, note=f"dtype {output.dtype} != {reference.dtype}")
    if output.device != reference.device:
        return Comparison(False, Category.WRONG_DEVICE, note=f"device {output.device} != {reference.device}")
    max_abs, mean_abs, max_rel = error_summary(reference, output)
    ok = bool(torch.allclose(output, reference, atol=atol, rtol=rtol))
    category = None if ok else (Category.NAN_INF_MISMATCH if _nan_inf_differ(reference, output) else Category.VALUE_MISMATCH)
    return Comparison(ok, category, max_abs, mean_abs, max_rel)


def error_summary(reference: torch.Tensor, output: torch.Tensor) -> tuple[float, float, float]:
    """(max |out - ref|, mean |out - ref|, max |out - ref| / |ref|) over finite elements, as floats."""
    if reference.numel() == 0:
        return 0.0, 0.0, 0.0
    ref = reference.detach().double()
    out = output.detach().double()
    diff = (out - ref).abs()
    finite = torch.isfinite(diff)
    if not bool(finite.any()):
        return float("inf"), float("inf"), float("inf")
    d = diff[finite]
    rel = d / ref.abs()[finite].clamp_min(torch.finfo(torch.float32).tiny)
    return float(d.max()), float(d.mean()), float(rel.max())


def _nan_inf_differ(reference: torch.Tensor, output: torch.Tensor) -> bool:
    if not reference.is_floating_point():
        return False
    return bool((torch.isnan(reference) != torch.isnan(output)).any()
                or (torch.isinf(reference) != torch.isinf(output)).any())
