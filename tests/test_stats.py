"""Timing statistics: intervals, the stopping rule, interleaving."""

from __future__ import annotations

import math
import random

from kbv.stats import (StopRule, bootstrap_ratio_ci, interleave_order, median, median_ci, median_halfwidth)


def test_median_ci_covers_the_median_and_narrows_with_samples():
    rng = random.Random(1)
    few = [10 + rng.gauss(0, 1) for _ in range(20)]
    many = [10 + rng.gauss(0, 1) for _ in range(2000)]
    lo, hi = median_ci(many)
    assert lo <= median(many) <= hi
    assert median_halfwidth(many) < median_halfwidth(few)
    assert math.isinf(median_halfwidth([1.0, 2.0]))


def test_median_ci_coverage_is_about_95_percent():
    rng = random.Random(2)
    hits = 0
    for _ in range(400):
        xs = [rng.expovariate(1.0) for _ in range(60)]
        lo, hi = median_ci(xs)
        hits += lo <= math.log(2) <= hi
    assert 0.90 <= hits / 400 <= 0.995


def test_bootstrap_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = random.Random(3)
    hits, widths = 0, []
    for rep in range(100):
        base = [2.0 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(100)]
        cand = [1.0 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(100)]
        lo, hi = bootstrap_ratio_ci(base, cand, resamples=500, seed=rep)
        hits += lo < 2.0 < hi
        widths.append(hi - lo)
    assert hits >= 85
    assert max(widths) < 0.05


def test_interleave_alternates_direction():
    assert interleave_order(3, 0) == [0, 1, 2]
    assert interleave_order(3, 1) == [2, 1, 0]
    order = interleave_order(2, 0) + interleave_order(2, 1)
    assert order == [0, 1, 1, 0]  # ABBA: a linear drift cancels


def test_stop_rule_needs_precision_samples_and_time():
    rule = StopRule(target=0.01, min_samples=20, min_time_ms=1.0, max_samples=100, max_time_s=5)
    steady = [1.0] * 30
    noisy = [1.0, 2.0] * 15
    assert rule.satisfied([steady, steady])
    assert not rule.satisfied([steady, noisy])
    assert not rule.satisfied([[1.0] * 5, steady])  # too few samples
    assert not rule.satisfied([[0.01] * 30, steady])  # too little measured time
    assert rule.exhausted([[1.0] * 100, [1.0] * 100], 0.0)
    assert rule.exhausted([steady], 6.0)
    assert not rule.exhausted([steady], 1.0)
