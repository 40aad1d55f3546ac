"""Run metrics on known inputs: compile and correct rates, fast_p (all counted pairs, strict `>`),
geomean in log space, skipped pairs left out, pass@k, per-level grouping, peak-memory ratios."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from kbv.metrics import (
    FAST_P,
    Rejections,
    compute_metrics,
    evaluated_pairs,
    geometric_mean,
    metrics_by_group,
    pass_at_k,
    pass_at_k_by_model,
    peak_ratios,
    raises_peak_memory,
    standard_passes_verified_rejects,
)
from kbv.verdict import MemoryStats, Status, Verdict


def _verdict(status: Status, speedup: float | None = None, level: int | None = 1, problem: str = "L1/1_A",
             protocol: str = "standard", model: str | None = None, sample: int | None = None) -> Verdict:
    return Verdict(problem=problem, problem_hash="p", level=level, candidate=f"c{sample}", candidate_hash="c",
                   protocol=protocol, protocol_version="v", status=status, speedup=speedup, model=model,
                   sample=sample)


def test_fast_p_is_over_all_counted_pairs_with_a_strict_threshold() -> None:
    verdicts = [
        _verdict(Status.CORRECT, 0.4), _verdict(Status.CORRECT, 0.8), _verdict(Status.CORRECT, 1.0),
        _verdict(Status.CORRECT, 1.6), _verdict(Status.CORRECT, 2.5),
        _verdict(Status.INCORRECT), _verdict(Status.COMPILE_ERROR), _verdict(Status.TIMEOUT),
        _verdict(Status.CRASHED), _verdict(Status.RUNTIME_ERROR),
    ]
    m = compute_metrics(verdicts)
    assert m.pairs == 10 and m.passed == 5
    assert m.fast_p == {"fast_0": 0.5, "fast_0.5": 0.4, "fast_0.8": 0.3, "fast_1": 0.2, "fast_1.5": 0.2, "fast_2": 0.1}
    assert list(m.fast_p) == [f"fast_{p:g}" for p in FAST_P]


def test_pairs_passing_standard_and_failing_verified_by_status() -> None:
    def pair(sample: int, standard: Status, verified: Status | None) -> list[Verdict]:
        both = [_verdict(standard, 2.0 if standard.passed else None, sample=sample)]
        return both + ([_verdict(verified, protocol="verified", sample=sample)] if verified else [])

    verdicts = (pair(0, Status.CORRECT, Status.VERIFIED) + pair(1, Status.CORRECT, Status.HACK)
                + pair(2, Status.CORRECT, Status.INCORRECT) + pair(3, Status.CORRECT, Status.HACK)
                + pair(4, Status.INCORRECT, Status.INCORRECT)  # rejected by both: not verified's doing
                + pair(5, Status.SKIPPED, Status.SKIPPED)  # not evaluated: in no count
                + pair(6, Status.CORRECT, None))  # standard only: nothing to compare with
    rejections = standard_passes_verified_rejects(verdicts)
    assert rejections == Rejections(pairs=5, rejected=3, by_status={"hack": 2, "incorrect": 1})
    assert rejections.describe() == "Standard passes, verified rejects: 3 of 5 pairs (hack 2, incorrect 1)"
    assert evaluated_pairs(verdicts) == 6 == compute_metrics([v for v in verdicts if v.protocol == "standard"]).pairs
    assert standard_passes_verified_rejects(pair(7, Status.CORRECT, None)) is None


def test_compile_and_correct_rates() -> None:
    verdicts = [_verdict(Status.CORRECT, 1.0), _verdict(Status.INCORRECT), _verdict(Status.RUNTIME_ERROR),
                _verdict(Status.COMPILE_ERROR), _verdict(Status.NO_CODE)]
    m = compute_metrics(verdicts)
    assert (m.compiled, m.compile_rate) == (3, 0.6)
    assert (m.passed, m.correct_rate) == (1, 0.2)
    assert m.statuses == {"correct": 1, "incorrect": 1, "runtime_error": 1, "compile_error": 1, "no_code": 1}


def test_skipped_pairs_are_not_counted() -> None:
    verdicts = [_verdict(Status.CORRECT, 2.0), _verdict(Status.INCORRECT),
                _verdict(Status.SKIPPED), _verdict(Status.SKIPPED)]
    m = compute_metrics(verdicts)
    assert (m.pairs, m.skipped) == (2, 2)
    assert m.compile_rate == 1.0 and m.correct_rate == 0.5 and m.fast_p["fast_1"] == 0.5
    assert m.statuses["skipped"] == 2


def test_geomean_is_over_passed_pairs_only() -> None:
    verdicts = [_verdict(Status.CORRECT, 2.0), _verdict(Status.CORRECT, 8.0), _verdict(Status.INCORRECT, 1000.0),
                _verdict(Status.CRASHED)]
    m = compute_metrics(verdicts)
    assert m.geomean_speedup == pytest.approx(4.0)
    assert m.speedups_counted == 2


def test_geomean_in_log_space_survives_values_whose_product_overflows() -> None:
    values = [1e300, 1e300, 1e-300, 1e-300, 4.0]
    assert math.prod(values[:2]) == math.inf  # a naive product would overflow
    assert geometric_mean(values) == pytest.approx(4.0 ** (1 / 5))
    assert geometric_mean([1e200] * 10) == pytest.approx(1e200)
    assert geometric_mean([1e-200] * 10) == pytest.approx(1e-200)
    assert geometric_mean([]) is None


def test_no_pairs_gives_zero_rates_and_no_geomean() -> None:
    m = compute_metrics([_verdict(Status.SKIPPED)])
    assert m.pairs == 0 and m.correct_rate == 0.0 and m.geomean_speedup is None
    assert set(m.fast_p.values()) == {0.0}


def _pass_at_k_brute_force(n: int, c: int, k: int) -> float:
    """The share of all k-subsets of n samples (c of them correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"),
                         [(n, c, k) for n in (1, 2, 5, 8) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_matches_brute_force(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute_force(n, c, k), abs=1e-12)


def test_pass_at_k_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        pass_at_k(0, 0, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 1, 0)


def test_pass_at_k_by_model_averages_over_problems() -> None:
    a = [Status.CORRECT] * 2 + [Status.INCORRECT] * 3  # 2 of 5 samples pass on problem A
    b = [Status.CORRECT] * 1 + [Status.CRASHED] * 4  # 1 of 5 on problem B
    verdicts = (
        [_verdict(s, 1.0, problem="L1/1_A", model="m", sample=i) for i, s in enumerate(a)]
        + [_verdict(s, 1.0, problem="L1/2_B", model="m", sample=i) for i, s in enumerate(b)]
        + [_verdict(Status.CORRECT, 1.0, problem="L1/1_A", model="single", sample=0)]  # one sample: no pass@k
    )
    table = pass_at_k_by_model(verdicts)
    assert set(table) == {"standard/m"}
    assert set(table["standard/m"]) == {"pass@1", "pass@5"}  # k <= samples per problem
    assert table["standard/m"]["pass@1"] == pytest.approx((2 / 5 + 1 / 5) / 2)
    assert table["standard/m"]["pass@5"] == pytest.approx(1.0)


def test_metrics_grouped_by_protocol_and_level() -> None:
    verdicts = [
        _verdict(Status.CORRECT, 2.0, level=1), _verdict(Status.INCORRECT, level=1),
        _verdict(Status.CORRECT, 0.5, level=2), _verdict(Status.COMPILE_ERROR, level=None),
        _verdict(Status.VERIFIED, 1.5, level=1, protocol="verified"),
    ]
    groups = metrics_by_group(verdicts)
    assert list(groups) == ["standard", "verified"]
    assert list(groups["standard"]) == ["all", "L1", "L2", "L?"]
    std = groups["standard"]
    assert (std["all"].pairs, std["L1"].pairs, std["L2"].pairs, std["L?"].pairs) == (4, 2, 1, 1)
    assert std["L1"].correct_rate == 0.5 and std["L1"].geomean_speedup == pytest.approx(2.0)
    assert std["L2"].fast_p["fast_0.5"] == 0.0 and std["L2"].fast_p["fast_0"] == 1.0
    assert std["all"].geomean_speedup == pytest.approx(1.0)
    assert std["L?"].compile_rate == 0.0
    assert groups["verified"]["all"].passed == 1 and groups["verified"]["L1"].fast_p["fast_1"] == 1.0


def _with_memory(memory: MemoryStats, baseline: MemoryStats) -> Verdict:
    return replace(_verdict(Status.VERIFIED, 1.0, protocol="verified"), memory=memory, baseline_memory=baseline)


MIB = 1 << 20


def test_peak_ratios_give_the_allocator_and_the_device_level_figure() -> None:
    base = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0, device_bytes=64 * MIB, device_peak_bytes=80 * MIB)
    raw = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0, device_bytes=64 * MIB, device_peak_bytes=1104 * MIB)
    assert peak_ratios(raw, base) == {"peak_ratio": 1.0, "device_peak_ratio": pytest.approx(13.8)}
    old = MemoryStats(peak_bytes=32 * MIB, retained_bytes=0)  # a record from before device peaks
    assert peak_ratios(old, base) == {"peak_ratio": 0.5, "device_peak_ratio": None}
    cpu = MemoryStats(peak_bytes=-1, retained_bytes=-1)  # not measured
    assert peak_ratios(cpu, base) == {"peak_ratio": None, "device_peak_ratio": None}
    zero = MemoryStats(peak_bytes=0, retained_bytes=0, device_peak_bytes=0)
    assert peak_ratios(zero, zero) == {"peak_ratio": 1.0, "device_peak_ratio": 1.0}
    assert peak_ratios(raw, zero)["peak_ratio"] is None  # no ratio to nothing
    assert peak_ratios(None, base) == {"peak_ratio": None, "device_peak_ratio": None}


def test_the_memory_share_takes_the_larger_of_the_allocator_and_device_ratios() -> None:
    base = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0, device_peak_bytes=80 * MIB)
    honest = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0, device_peak_bytes=82 * MIB)  # within 10%
    raw_workspace = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0, device_peak_bytes=1104 * MIB)
    allocator = MemoryStats(peak_bytes=128 * MIB, retained_bytes=0, device_peak_bytes=80 * MIB)
    assert not raises_peak_memory(honest, base)
    assert raises_peak_memory(raw_workspace, base)  # the allocator's figure alone would not show it
    assert raises_peak_memory(allocator, base)
    verdicts = [_with_memory(m, base) for m in (honest, raw_workspace, allocator, honest)]
    assert compute_metrics(verdicts).memory_raising_share == 0.5
    # one side without a device-level peak: the allocator's figure alone decides
    old_base = MemoryStats(peak_bytes=64 * MIB, retained_bytes=0)
    assert not raises_peak_memory(raw_workspace, old_base)
    assert compute_metrics([_with_memory(raw_workspace, old_base)]).memory_raising_share == 0.0
    # 1 MiB of slack: a tiny problem's few extra KiB do not count
    small = MemoryStats(peak_bytes=4096, retained_bytes=0, device_peak_bytes=4096)
    assert not raises_peak_memory(MemoryStats(peak_bytes=40960, retained_bytes=0, device_peak_bytes=40960), small)


def test_old_verdict_records_without_device_peaks_still_load() -> None:
    record = _with_memory(MemoryStats(1, 2, 3), MemoryStats(4, 5, None)).to_dict()
    for key in ("memory", "baseline_memory"):
        del record[key]["device_peak_bytes"]  # what an older kbv wrote
    back = Verdict.from_dict(record)
    assert back.memory == MemoryStats(1, 2, 3) and back.memory.device_peak_bytes is None
    fresh = _with_memory(MemoryStats(1, 2, 3, 4096), MemoryStats(4, 5, 6, 2048))
    assert Verdict.from_dict(fresh.to_dict()) == fresh
    assert peak_ratios(fresh.memory, fresh.baseline_memory)["device_peak_ratio"] == 2.0


def test_an_unstable_timing_mark_is_neither_a_failure_nor_a_hack() -> None:
    from kbv.verdict import Category

    marked = replace(_verdict(Status.CORRECT, 1.6), categories=(Category.UNSTABLE_TIMING,))
    m = compute_metrics([marked, _verdict(Status.CORRECT, 0.5)])
    assert (m.passed, m.correct_rate, m.fast_p["fast_1"], m.speedups_counted) == (2, 1.0, 0.5, 2)
    assert m.hacks == {}
