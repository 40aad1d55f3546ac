"""Comparing candidate outputs with reference outputs. Pure functions of tensors."""

from __future__ import annotations

import math
import weakref
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
    # a chunk at a time: allclose over the whole is allclose over every chunk, and a multi-GB output
    # whole costs ~3x its size in temporaries (KernelBench's L1/9 ran a 24 GiB host out of memory)
    ref_flat, out_flat = reference.detach().reshape(-1), output.detach().reshape(-1)  # in their own dtype
    ok = all(bool(torch.allclose(out_flat[i:i + CHUNK], ref_flat[i:i + CHUNK], atol=atol, rtol=rtol))
             for i in range(0, max(ref_flat.numel(), 1), CHUNK))
    category = None if ok else (Category.NAN_INF_MISMATCH if _nan_inf_differ(reference, output) else Category.VALUE_MISMATCH)
    return Comparison(ok, category, max_abs, mean_abs, max_rel)


def error_summary(reference: torch.Tensor, output: torch.Tensor) -> tuple[float, float, float]:
    """(max |out - ref|, mean |out - ref|, max |out - ref| / |ref|) over finite elements, as floats.
    Computed a chunk at a time (`CHUNK`), so that a multi-GB output costs no multi-GB temporaries."""
    if reference.numel() == 0:
        return 0.0, 0.0, 0.0
    max_abs, sum_abs, count, max_rel = 0.0, 0.0, 0, 0.0
    for ref, out in _chunks(reference, output):
        d = torch.sub(out, ref).abs_()
        if math.isfinite(float(d.sum())):  # every difference finite (almost always): no mask
            rel = d / ref.abs().clamp_min_(torch.finfo(torch.float32).tiny)
        else:
            finite = torch.isfinite(d)
            d = d[finite]
            if d.numel() == 0:
                continue
            rel = d / ref.abs()[finite].clamp_min(torch.finfo(torch.float32).tiny)
        max_abs, max_rel = max(max_abs, float(d.max())), max(max_rel, float(rel.max()))
        sum_abs, count = sum_abs + float(d.sum()), count + d.numel()
    if count == 0:
        return float("inf"), float("inf"), float("inf")
    return max_abs, sum_abs / count, max_rel


CHUNK = 1 << 22  # elements compared at a time: float64 temporaries of 32 MiB each, whatever the output's size


def _chunks(truth: torch.Tensor, output: torch.Tensor | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching slices of `truth` and `output` (on truth's device), each as float64 (a float64 truth's
    slices are views of it: never written)."""
    t_flat = truth.detach().reshape(-1)
    o_flat = output.detach().reshape(-1) if output is not None else None
    for start in range(0, t_flat.numel(), CHUNK):
        t = t_flat[start:start + CHUNK].to(torch.float64)
        o = o_flat[start:start + CHUNK].to(device=t.device, dtype=torch.float64) if o_flat is not None else t
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


@dataclass(frozen=True)
class TruthStats:
    """One truth tensor's figures, taken once and kept while it is unchanged (`truth_stats`)."""

    count: int  # its elements
    finite: bool  # every element finite
    square_sum: float  # sum of squares (of the finite elements)
    total: float  # sum (of the finite elements)

    @property
    def rms(self) -> float:
        return (self.square_sum / self.count) ** 0.5 if self.count else 0.0


_STATS: dict[int, tuple[weakref.ref[torch.Tensor], int, TruthStats]] = {}


def truth_stats(truth: torch.Tensor) -> TruthStats:
    """`truth`'s figures, computed once per tensor while its contents are unchanged (its version):
    the same truth is compared with many outputs (a candidate's trials, the screen's trivials)."""
    key = id(truth)
    held = _STATS.get(key)
    if held is not None and held[0]() is truth and held[1] == truth._version:
        return held[2]
    count, finite, square_sum, total = 0, True, 0.0, 0.0
    for t, _ in _chunks(truth, None):
        square = float(torch.dot(t, t)) if t.numel() else 0.0
        if not math.isfinite(square):  # a NaN or infinity (or a square past float64's range): masked
            t = t[torch.isfinite(t)]
            finite, square = False, float(torch.dot(t, t)) if t.numel() else 0.0
        count += t.numel()
        square_sum += square
        total += float(t.sum())
    stats = TruthStats(count, finite, square_sum, total)
    if len(_STATS) > 256:
        for k in [k for k, (ref, _, _) in _STATS.items() if ref() is None]:
            del _STATS[k]
    _STATS[key] = (weakref.ref(truth), truth._version, stats)
    return stats


def measure_error(truth: torch.Tensor, output: torch.Tensor) -> ErrorMeasure:
    """Errors of `output` against `truth` (float64), over the elements finite in both, a chunk at a
    time (`CHUNK`): a multi-GB output costs no multi-GB temporaries. Where both are finite everywhere
    (almost always) one pass, against the truth's kept rms (`truth_stats`); else two, masked."""
    stats = truth_stats(truth)
    if stats.finite:
        measured = _measure_finite(truth, output, stats)
        if measured is not None:
            return measured
    return _measure_masked(truth, output)


def _measure_finite(truth: torch.Tensor, output: torch.Tensor, stats: TruthStats) -> ErrorMeasure | None:
    """One pass where the truth is finite everywhere; None as soon as the output is not (the masked
    path then measures it)."""
    if stats.count == 0:
        return ErrorMeasure(0.0, 0.0, True)
    scale = max(stats.rms, torch.finfo(torch.float64).tiny)
    diff_sum, elem = 0.0, 0.0
    for t, o in _chunks(truth, output):
        d = torch.sub(o, t)  # (chunk,) a temporary of its own: `t` may be the truth itself
        square = float(torch.dot(d, d))
        if not math.isfinite(square):  # a NaN or infinity in the output (or a square past float64's range)
            return None
        diff_sum += square
        d.abs_().div_(t.abs().add_(scale))
        elem = max(elem, float(d.max()))
    return ErrorMeasure(diff_sum ** 0.5 / (scale * stats.count ** 0.5), elem, True)


def _measure_masked(truth: torch.Tensor, output: torch.Tensor) -> ErrorMeasure:
    """Two passes over the elements finite in both: the truth's rms there, then the errors."""
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


def constant_fails(value: float, truth: torch.Tensor, allowed: ErrorMeasure) -> bool:
    """Whether an output equal to `value` everywhere fails against `truth` on its normwise error
    alone, from the truth's kept figures (no pass over it): ||c - t||^2 = n c^2 - 2 c sum(t) + sum(t^2).
    False where that cannot decide (a non-finite truth, or a normwise error within what is allowed:
    the caller then measures the whole output)."""
    stats = truth_stats(truth)
    if not stats.finite or stats.count == 0 or not math.isfinite(value):
        return False
    scale = max(stats.rms, torch.finfo(torch.float64).tiny)
    squared = max(stats.count * value * value - 2 * value * stats.total + stats.square_sum, 0.0)
    norm = squared ** 0.5 / (scale * stats.count ** 0.5)
    return norm > 2 * allowed.norm  # a margin over the sum's rounding: a near pass is measured in full


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
