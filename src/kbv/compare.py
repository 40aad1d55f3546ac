"""Comparing candidate outputs with reference outputs. Pure functions of tensors."""

from __future__ import annotations

from collections.abc import Iterator
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
    """(max |out - ref|, mean |out - ref|, max |out - ref| / |ref|) over finite elements, as floats.
    Computed a chunk at a time (`CHUNK`), so that a multi-GB output costs no multi-GB temporaries."""
    if reference.numel() == 0:
        return 0.0, 0.0, 0.0
    max_abs, sum_abs, count, max_rel = 0.0, 0.0, 0, 0.0
    for ref, out in _chunks(reference, output):
        diff = (out - ref).abs()
        finite = torch.isfinite(diff)
        d = diff[finite]
        if d.numel() == 0:
            continue
        rel = d / ref.abs()[finite].clamp_min(torch.finfo(torch.float32).tiny)
        max_abs, max_rel = max(max_abs, float(d.max())), max(max_rel, float(rel.max()))
        sum_abs, count = sum_abs + float(d.sum()), count + d.numel()
    if count == 0:
        return float("inf"), float("inf"), float("inf")
    return max_abs, sum_abs / count, max_rel


CHUNK = 1 << 22  # elements compared at a time: float64 temporaries of 32 MiB each, whatever the output's size


def _chunks(truth: torch.Tensor, output: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching slices of `truth` and `output` (on truth's device), each as float64."""
    t_flat = truth.detach().reshape(-1)
    o_flat = output.detach().reshape(-1)
    for start in range(0, t_flat.numel(), CHUNK):
        t = t_flat[start:start + CHUNK].to(torch.float64)
        o = o_flat[start:start + CHUNK].to(device=t.device, dtype=torch.float64)
        yield t, o


def _nan_inf_differ(reference: torch.Tensor, output: torch.Tensor) -> bool:
    if not reference.is_floating_point():
        return False
    return bool((torch.isnan(reference) != torch.isnan(output)).any()
                or (torch.isinf(reference) != torch.isinf(output)).any())


# -- the verified protocol's comparison --------------------------------------------------------

FP32_EPS = float(torch.finfo(torch.float32).eps)


@dataclass(frozen=True)
class Tolerance:
    """Acceptance: error <= factor * (the TF32 baseline's own error) + floor, in both measures.

    Floors are in fp32 ulps of the output's scale. The normwise floor admits any honest fp32
    evaluation order (a sequential sum of 4096 terms errs by ~40 ulps); the elementwise floor is
    looser because one element can sit near cancellation.
    """

    factor: float = 4.0
    floor_norm_ulps: float = 64.0
    floor_elem_ulps: float = 512.0


@dataclass(frozen=True)
class ErrorMeasure:
    """Scale-invariant errors of an output against float64 truth."""

    norm: float  # ||out - truth|| / ||truth||
    elem: float  # max |out - truth| / (|truth| + rms(truth))
    nan_inf_match: bool  # NaN / +inf / -inf masks identical to the truth's

    @property
    def worst(self) -> float:
        return max(self.norm, self.elem)


def measure_error(truth: torch.Tensor, output: torch.Tensor) -> ErrorMeasure:
    """Errors of `output` against `truth` (float64), over the elements finite in both. Two passes of
    chunks (`CHUNK`): the truth's rms first, then the errors against it; a multi-GB output costs no
    multi-GB temporaries."""
    match, count, square_sum = True, 0, 0.0
    for t, o in _chunks(truth, output):
        match = match and bool(torch.equal(torch.isnan(t), torch.isnan(o)) and torch.equal(t == float("inf"), o == float("inf"))
                               and torch.equal(t == float("-inf"), o == float("-inf")))
        t = t[torch.isfinite(t) & torch.isfinite(o)]
        count += t.numel()
        square_sum += float(t.square().sum())
    if count == 0:
        return ErrorMeasure(0.0, 0.0, match)
    rms = (square_sum / count) ** 0.5
    scale = max(rms, torch.finfo(torch.float64).tiny)
    diff_sum, elem = 0.0, 0.0
    for t, o in _chunks(truth, output):
        finite = torch.isfinite(t) & torch.isfinite(o)
        t, o = t[finite], o[finite]
        if t.numel() == 0:
            continue
        diff = (o - t).abs()
        diff_sum += float(diff.square().sum())
        elem = max(elem, float((diff / (t.abs() + scale)).max()))
    norm = diff_sum ** 0.5 / (scale * (count ** 0.5))
    return ErrorMeasure(norm, elem, match)


def allowed_error(baseline: ErrorMeasure, tol: Tolerance) -> ErrorMeasure:
    """The largest errors a candidate may show, given the baseline's own on the same inputs."""
    return ErrorMeasure(tol.factor * baseline.norm + tol.floor_norm_ulps * FP32_EPS,
                        tol.factor * baseline.elem + tol.floor_elem_ulps * FP32_EPS, True)


def within(candidate: ErrorMeasure, allowed: ErrorMeasure) -> bool:
    return candidate.nan_inf_match and candidate.norm <= allowed.norm and candidate.elem <= allowed.elem


@dataclass(frozen=True)
class Judgement:
    """Outputs against the truth: whether all pass, the worst output's figures, and every output's error."""

    passed: bool
    worst: ErrorMeasure | None = None  # the output with the largest error
    baseline: ErrorMeasure | None = None  # the baseline's own error on that output
    allowed: ErrorMeasure | None = None  # what that output was allowed
    errors: tuple[ErrorMeasure, ...] = ()  # every output's error, in order
    failing: tuple[int, ...] = ()  # the outputs outside what they were allowed


def judge_outputs(outputs: list[torch.Tensor], truth: list[torch.Tensor], baseline_err: list[ErrorMeasure],
                  tol: Tolerance) -> Judgement:
    """THE tolerance check of the verified protocol: every output within `allowed_error` of the
    baseline's own error on the same inputs (and NaN/Inf masks equal to the truth's)."""
    worst, worst_b, worst_a = None, None, None
    errors: list[ErrorMeasure] = []
    failing: list[int] = []
    for k, (out, t, base) in enumerate(zip(outputs, truth, baseline_err)):
        err = measure_error(t, out)
        allowed = allowed_error(base, tol)
        errors.append(err)
        if not within(err, allowed):
            failing.append(k)
        if worst is None or err.worst > worst.worst:
            worst, worst_b, worst_a = err, base, allowed
    return Judgement(not failing and len(outputs) == len(truth), worst, worst_b, worst_a, tuple(errors), tuple(failing))
