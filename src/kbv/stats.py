"""Timing statistics: pure functions of samples (milliseconds).

- `median_halfwidth`: the relative half-width of a ~95% confidence interval of the median
  (order-statistic interval), the quantity the adaptive stopping rule drives below its target;
- `bootstrap_ratio_ci`: a percentile bootstrap interval of median(baseline) / median(candidate),
  each side resampled independently;
- `interleave_order`: ABBA-style block order, so slow drifts of clock or temperature cancel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def median_ci(xs: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free ~95% interval of the median: the order statistics n/2 -+ z*sqrt(n)/2."""
    s = np.sort(np.asarray(xs, dtype=np.float64))
    n = len(s)
    if n == 0:
        raise ValueError("no samples")
    half = z * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    return float(s[lo]), float(s[hi])


def median_halfwidth(xs: Sequence[float]) -> float:
    """Relative half-width of `median_ci` (inf for fewer than 3 samples or a zero median)."""
    if len(xs) < 3:
        return math.inf
    lo, hi = median_ci(xs)
    m = median(xs)
    return (hi - lo) / 2 / m if m > 0 else math.inf


def bootstrap_ratio_ci(baseline: Sequence[float], candidate: Sequence[float], resamples: int = 2000,
                       level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(baseline) / median(candidate)."""
    rng = np.random.default_rng(seed)
    b = np.asarray(baseline, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    bi = rng.integers(0, len(b), size=(resamples, len(b)))
    ci = rng.integers(0, len(c), size=(resamples, len(c)))
    ratios = np.median(b[bi], axis=1) / np.maximum(np.median(c[ci], axis=1), 1e-12)
    alpha = (1 - level) / 2
    return float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def interleave_order(n_impl: int, round_index: int) -> list[int]:
    """Implementation order for one round: forward on even rounds, backward on odd (ABBA...)."""
    order = list(range(n_impl))
    return order if round_index % 2 == 0 else order[::-1]


@dataclass(frozen=True)
class StopRule:
    """Sample until every implementation's median is known to `target` (relative half-width), with
    at least `min_samples` and `min_time_ms` of measured time each; stop regardless at `max_samples`
    each or `max_time_s` of wall time."""

    target: float = 0.01
    min_samples: int = 20
    min_time_ms: float = 100.0
    max_samples: int = 1000
    max_time_s: float = 30.0

    def satisfied(self, samples: Sequence[Sequence[float]]) -> bool:
        return all(len(s) >= self.min_samples and sum(s) >= self.min_time_ms
                   and median_halfwidth(s) <= self.target for s in samples)

    def exhausted(self, samples: Sequence[Sequence[float]], elapsed_s: float) -> bool:
        return elapsed_s >= self.max_time_s or all(len(s) >= self.max_samples for s in samples)
