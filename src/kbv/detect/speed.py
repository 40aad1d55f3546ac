"""Timing rules: pure functions of the timer's samples and the device's measured bandwidth.

- `wall_bound`: the parent's wall clock per call (less the baseline child's own overhead) bounds the
  candidate's real time; beyond noise the candidate is charged it, grossly beyond it is a lie;
- `impossible_speed`: a call faster than the device's copy bandwidth allows did not read its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kbv.protocols.verified.rules import CHARGE_RATIO, CHARGE_SLACK_MS, HACK_RATIO, IMPOSSIBLE_FACTOR
from kbv.stats import median
from kbv.verdict import Category


class Sampled(Protocol):
    parent_ms: Sequence[float]  # the parent's wall clock per call, per block
    device_ms: Sequence[float]  # what the child reported per call


@dataclass(frozen=True)
class WallBound:
    charge: float = 1.0
    findings: tuple[tuple[Category, str], ...] = ()
    notes: tuple[str, ...] = ()


def wall_bound(cand: Sampled, base: Sampled | None) -> WallBound:
    """The parent's wall clock per call, less the overhead the trusted baseline child shows (flush,
    synchronisation, the pipe), bounds the candidate's real time from below. Beyond noise
    (CHARGE_RATIO x reported + CHARGE_SLACK_MS) the candidate is charged that wall time, so work done
    outside its timed windows (deferred, in a thread, in a finaliser) buys nothing; beyond HACK_RATIO
    the report is a lie worth naming. An honest kernel can sit between the two: freeing its outputs,
    a garbage collection, an interpreter's bookkeeping all fall outside the window (the Triton
    interpreter on a small CPU shows 1.2x)."""
    if base is None or not cand.parent_ms or not base.parent_ms:
        return WallBound()
    overhead = max(median(base.parent_ms) - median(base.device_ms), 0.0)
    implied = median(cand.parent_ms) - overhead
    reported = median(cand.device_ms)
    if implied <= CHARGE_RATIO * reported + CHARGE_SLACK_MS:
        return WallBound()
    charge = implied / max(reported, 1e-9)
    said = (f"the parent's wall clock implies {implied:.3f} ms a call, the child reported {reported:.3f} ms "
            f"(baseline overhead {overhead:.3f} ms)")
    if implied > HACK_RATIO * reported + CHARGE_SLACK_MS:
        return WallBound(charge, ((Category.TIMING_MISMATCH, said),), (said,))
    return WallBound(charge, (), (f"charged the wall time ({charge:.2f}x its report): {said}",))


def impossible_speed(min_bytes: int, candidate_ms: float, copy_gbps: float) -> tuple[Category, str] | None:
    """A call that must move at least `min_bytes` through DRAM (its inputs, cold after the flush, and
    what of its outputs cannot stay in L2) yet finishes faster than IMPOSSIBLE_FACTOR x the device's
    own measured copy bandwidth allows did not read what it was given: the inputs were kept warm
    (persisting L2, a stale copy) or the work was skipped. The factor leaves room for kernels that
    legitimately read part of an input (a strided convolution skipping rows)."""
    if min_bytes <= 0 or candidate_ms <= 0 or copy_gbps <= 0:
        return None
    achieved = min_bytes / (candidate_ms * 1e-3) / 1e9
    if achieved <= IMPOSSIBLE_FACTOR * copy_gbps:
        return None
    said = (f"a call moved at least {min_bytes / 1e6:.1f} MB in {candidate_ms:.4f} ms: {achieved:.0f} GB/s, above "
            f"{IMPOSSIBLE_FACTOR:g}x the device's measured copy bandwidth ({copy_gbps:.0f} GB/s)")
    return (Category.IMPOSSIBLE_SPEED, said)
