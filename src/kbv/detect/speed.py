"""Timing rules: pure functions of the timer's samples and the device's measured bandwidth.

- `wall_bound`: the parent's wall clock per call bounds the candidate's real time; its time outside
  its timed calls beyond the baseline's in the same rounds is charged, and grossly beyond it is a lie;
- `impossible_speed`: a call faster than the device's copy bandwidth allows did not read its inputs;
- `window_resolution_ms`, `too_short_to_time`: a median made of what is left once the window's own
  costs are taken out is no figure where it is within what taking them out is unsure by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kbv.protocols.verified.rules import (
    CAPPED_ROUNDS_SHARE,
    CHARGE_RATIO,
    CHARGE_SLACK_MS,
    EVENT_RESOLUTION_MS,
    HACK_RATIO,
    IMPOSSIBLE_FACTOR,
    WINDOW_NOISE_FACTOR,
)
from kbv.stats import median
from kbv.verdict import Category


@dataclass(frozen=True)
class WallBlock:
    """One timed block as the parent saw it, per call: its wall clock around the block, and what the
    child reported for the block's calls."""

    round: int  # the interleaved round it was timed in (each side times one block a round)
    wall_ms: float  # the parent's wall clock around the block, per call
    reported_ms: float  # the median of the child's reported windows for the block's calls (nothing taken out)

    @property
    def outside_ms(self) -> float:
        """What the child spent per call beyond its typical timed call: the pipe, the flush, freeing
        the outputs, waiting for a core the machine's other work held; and work a candidate hid there."""
        return self.wall_ms - self.reported_ms


class Sampled(Protocol):
    blocks: Sequence[WallBlock]  # the blocks that feed the wall clock (a recheck's copy does not)
    device_ms: Sequence[float]  # what the child reported per call, every call


@dataclass(frozen=True)
class WallBound:
    charge: float = 1.0
    findings: tuple[tuple[Category, str], ...] = ()
    notes: tuple[str, ...] = ()


def wall_bound(cand: Sampled, base: Sampled | None) -> WallBound:
    """The parent's wall clock bounds the candidate's real time from below: its reported time plus
    what it spends outside its timed calls beyond what the trusted baseline's child spends there
    (flush, synchronisation, the pipe), judged round by round: the baseline's block of the same
    round ran in the same moment, so load from other work on the machine, which delays both alike,
    cancels, and the median over rounds leaves out the few blocks that load hit on one side only.
    Beyond noise (CHARGE_RATIO x reported + CHARGE_SLACK_MS) the candidate is charged that wall time,
    so work done outside its timed windows (deferred, in a thread, in a finaliser) buys nothing;
    beyond HACK_RATIO the report is a lie worth naming. An honest kernel can sit between the two:
    freeing its outputs, a garbage collection, an interpreter's bookkeeping all fall outside the
    window (the Triton interpreter on a small CPU shows 1.2x)."""
    if base is None or not cand.device_ms:
        return WallBound()
    base_outside = {b.round: b.outside_ms for b in base.blocks}
    paired = [(c.outside_ms, base_outside[c.round]) for c in cand.blocks if c.round in base_outside]
    if not paired:
        return WallBound()
    beyond = median([c - b for c, b in paired])  # ms a call outside the window, beyond the baseline's
    overhead = median([b for _, b in paired])
    reported = median(cand.device_ms)
    implied = reported + beyond
    if implied <= CHARGE_RATIO * reported + CHARGE_SLACK_MS:
        return WallBound()
    charge = implied / max(reported, 1e-9)
    said = (f"the parent's wall clock implies {implied:.3f} ms a call, the child reported {reported:.3f} ms "
            f"(the baseline's time outside its timed calls in the same {len(paired)} rounds: {overhead:.3f} ms)")
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


def window_resolution_ms(costs_ms: Sequence[float]) -> float:
    """The least median a call can be told apart from nothing by, once the window's own costs are taken
    out of it: the events' resolution, or WINDOW_NOISE_FACTOR x the spread of `costs_ms` (the costs
    taken out, launch plus synchronise, one figure a round) from round to round (1.4826 x their median
    absolute deviation, a standard deviation robust to one round's burst), whichever is larger. Pure."""
    if len(costs_ms) < 2:
        return EVENT_RESOLUTION_MS
    mid = median(costs_ms)
    spread = 1.4826 * median([abs(c - mid) for c in costs_ms])
    return max(EVENT_RESOLUTION_MS, WINDOW_NOISE_FACTOR * spread)


def too_short_to_time(side: str, median_ms: float, capped_rounds: int, rounds: int, resolution_ms: float,
                      costs_ms: float | None) -> str | None:
    """Why `side`'s calls are too short to time against the window's costs, or None when its median
    `median_ms` (costs taken out) is a figure: it must exceed `resolution_ms` (see
    `window_resolution_ms`), and the costs measured beside its blocks (`costs_ms`, their median; None:
    none taken out) must not have exceeded its own quickest window in CAPPED_ROUNDS_SHARE of its
    `rounds` or more (`capped_rounds`: costs that large were measured while the host was busy, and
    what is left of a call is the spread of its windows). A speedup from such a side would be a
    ratio of subtraction artefacts (0, or a huge one). Pure."""
    costs = f" against the window's own costs of {costs_ms:.4f} ms" if costs_ms is not None else ""
    if median_ms <= resolution_ms:
        return (f"the {side}'s calls were too short to time{costs}: {median_ms:.4f} ms a call once they are "
                f"taken out, within the {resolution_ms:.4f} ms that taking them out is unsure by")
    if rounds and capped_rounds >= CAPPED_ROUNDS_SHARE * rounds:
        return (f"the {side}'s calls were too short to time{costs}: the costs measured beside its blocks "
                f"exceeded its own quickest call in {capped_rounds} of {rounds} rounds")
    return None
