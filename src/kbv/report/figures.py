"""The figures a report reads off one verdict: the primary baseline, its interval, memory ratios.

Pure functions of a `Verdict`. Memory figures are read defensively: runs written by older or newer kbv
may lack a field (the device-level ratio, say), and a missing figure is None, never an error.
"""

from __future__ import annotations

import math
from typing import Any

from kbv.verdict import Verdict


def primary_baseline(v: Verdict) -> str | None:
    """The baseline `v.speedup` was measured against (the timing's speedup equal to it), else the first
    with a speedup, else the first timed (a timing with no speedup: calls too short to time)."""
    if v.timing is None:
        return None
    for name, value in v.timing.speedups.items():
        if v.speedup is not None and value == v.speedup:
            return name
    return next(iter(v.timing.speedups), None) or next(iter(v.timing.baselines), None)


def speedup_interval(v: Verdict) -> tuple[float, float] | None:
    """The confidence interval of the primary speedup, where the protocol measured one."""
    name = primary_baseline(v)
    if v.timing is None or name is None:
        return None
    ci = v.timing.speedup_ci.get(name)
    return (float(ci[0]), float(ci[1])) if ci else None


def speedup_spread(v: Verdict) -> float | None:
    """The spread of the trials behind a speedup of means (the standard protocol's, which has no
    interval): the candidate's and the primary baseline's std/mean, combined as sqrt(a^2 + b^2), a
    share of the speedup. How far one trial's ratio strays, not an interval of the mean. None where
    the speedup has an interval or a side is missing."""
    name = primary_baseline(v)
    if v.timing is None or name is None or v.timing.statistic != "mean_ms" or v.timing.speedup_ci.get(name):
        return None
    cand, base = v.timing.candidate, v.timing.baselines.get(name)
    if base is None or cand.mean_ms <= 0 or base.mean_ms <= 0:
        return None
    return math.hypot(cand.std_ms / cand.mean_ms, base.std_ms / base.mean_ms)


def timed_std_ms(v: Verdict) -> tuple[float | None, float | None]:
    """(candidate, primary baseline) standard deviation of the timed calls, ms."""
    if v.timing is None:
        return None, None
    name = primary_baseline(v)
    base = v.timing.baselines.get(name) if name else None
    return v.timing.candidate.std_ms, base.std_ms if base is not None else None


def timed_ms(v: Verdict) -> tuple[float | None, float | None]:
    """(candidate, primary baseline) time in ms, by the statistic the speedup uses."""
    if v.timing is None:
        return None, None
    stat = v.timing.statistic
    cand = getattr(v.timing.candidate, stat, None)
    name = primary_baseline(v)
    base = v.timing.baselines.get(name) if name else None
    return cand, getattr(base, stat, None) if base is not None else None


def peak_ratio(v: Verdict) -> float | None:
    """The allocator's (or resident set's) peak of the candidate over the baseline's: 1.0 when both
    are zero (neither grew above its level before the call, as small forwards on a CPU do); None when
    either is missing, or only the baseline's is zero."""
    cand, base = _peak(v.memory), _peak(v.baseline_memory)
    if cand is None or base is None:
        return None
    if base <= 0:
        return 1.0 if cand <= 0 else None
    return cand / base


def device_peak_ratio(v: Verdict) -> float | None:
    """The device-level peak ratio where the run measured one (a field of the verdict or of its memory
    record, or an evidence entry); None for runs that did not."""
    for holder in (v, v.memory):
        value = _number(getattr(holder, "device_peak_ratio", None))
        if value is not None:
            return value
    memory_evidence = v.evidence.get("memory")
    if isinstance(memory_evidence, dict):
        value = _number(memory_evidence.get("device_peak_ratio"))
        if value is not None:
            return value
    return _number(v.evidence.get("device_peak_ratio"))


def memory_ratio(v: Verdict) -> float | None:
    """The larger of the allocator's and the device-level peak ratio (what "raises peak memory" reads)."""
    known = [r for r in (peak_ratio(v), device_peak_ratio(v)) if r is not None]
    return max(known) if known else None


def custom_share(v: Verdict) -> float | None:
    """The share of device time in the candidate's own kernels (verified attribution), if measured."""
    attribution = v.evidence.get("attribution")
    return _number(attribution.get("custom_share")) if isinstance(attribution, dict) else None


def _peak(memory: Any) -> int | None:
    value = getattr(memory, "peak_bytes", None) if memory is not None else None
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
