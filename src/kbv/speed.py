"""The verified protocol's timer, parent side: interleaved blocks, adaptive stopping, rechecks.

The candidate and each baseline live in their own child and hold the same pool of input sets (fresh
values, more bytes in total than the L2 cache). After a warm-up by time, the parent asks them in turn
(ABBA order) for blocks of timed calls; each call gets the next pool entry, a cold L2, and a
device-wide synchronise inside its timed window. Sampling stops once every median is known to the
target precision, or at a cap. A random call of every candidate block has its output copied out and
checked against the truth. The parent's own wall clock around each block bounds what a child can
claim: a candidate whose wall time (less the baseline child's overhead) exceeds its reported time
beyond noise is charged the wall time, and one that exceeds it grossly is a hack. Primitives
re-bound by the candidate are reported by the child's clock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.sandbox import Sandbox, SharedArena
from kbv.settings import time_left
from kbv.stats import StopRule, bootstrap_ratio_ci, interleave_order, median, median_ci
from kbv.verdict import Category, TimingStats


@dataclass(frozen=True)
class TimerConfig:
    stop: StopRule = field(default_factory=StopRule)
    block: int = 10  # calls per block
    warmup_ms: float = 200.0  # after the first (compiling) call
    rechecks_per_block: int = 1  # candidate outputs checked per block
    flush_factor: float = 2.0  # L2 flush = factor x L2 size
    pool_factor: float = 2.0  # pool bytes >= factor x L2 size
    max_pool_sets: int = 16


@dataclass
class _Side:
    name: str
    sb: Sandbox
    device_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    parent_ms: list[float] = field(default_factory=list)  # parent wall per call, per block
    tampered: set[str] = field(default_factory=set)
    persisting_l2: str | None = None
    cursor: int = 0


@dataclass(frozen=True)
class SpeedResult:
    stats: dict[str, TimingStats]  # "candidate" and each baseline
    speedups: dict[str, float]  # baseline -> median(baseline) / median(candidate)
    speedup_ci: dict[str, tuple[float, float]]
    findings: tuple[tuple[Category, str], ...]
    rechecked: int
    timer_s: float
    charge: float = 1.0  # the candidate's speedups are divided by this (>= 1: its wall clock exceeded its report)
    notes: tuple[str, ...] = ()


def pool_size(bytes_per_set: int, l2_bytes: int, config: TimerConfig) -> int:
    """How many input sets make the pool exceed `pool_factor` x L2 (at least 2)."""
    need = int(config.pool_factor * l2_bytes)
    sets = -(-need // max(bytes_per_set, 1))
    return max(2, min(config.max_pool_sets, sets))


def load_pool(sb: Sandbox, arena: SharedArena, pool: list[list[Any]], flush_bytes: int, timeout_s: float) -> None:
    handles = [arena.handles(inputs) for inputs in pool]
    sb.call({"op": "pool", "pool": handles, "flush_bytes": flush_bytes}, timeout_s)


def measure_speed(candidate: Sandbox, baselines: dict[str, Sandbox], arena: SharedArena, config: TimerConfig,
                  pool_len: int, check: Callable[[int, list[torch.Tensor]], str | None],
                  output_like: list[torch.Tensor], deadline: float) -> SpeedResult:
    """Time the candidate against every baseline (all already hold the pool). `check(pool_index,
    outputs)` returns why a timed output is wrong, or None; `output_like` gives the outputs' shapes
    and dtypes (meta tensors will do)."""
    t0 = time.monotonic()
    sides = [_Side("candidate", candidate)] + [_Side(n, sb) for n, sb in baselines.items()]
    for side in sides:
        side.sb.call({"op": "warmup", "ms": config.warmup_ms}, time_left(deadline))
    rng = random.Random(0x7137)
    findings: list[tuple[Category, str]] = []
    rechecked = 0
    rnd = 0
    while True:
        for i in interleave_order(len(sides), rnd):
            side = sides[i]
            # every other candidate block copies one output out for a recheck; the copy (a device-to-
            # host transfer into fresh shared memory) is slow, so those blocks do not feed the wall clock
            recheck = rng.randrange(config.block) if side.name == "candidate" and rnd % 2 == 1 else None
            outs = _time_one_block(side, arena, config, pool_len, recheck, output_like, deadline)
            if outs is not None:
                rechecked += 1
                index = (side.cursor - config.block + recheck) % pool_len
                why = check(index, outs)
                if why:
                    findings.append((Category.RESULT_CACHE, f"a timed call returned a wrong output: {why}"))
        rnd += 1
        samples = [s.device_ms for s in sides]
        if config.stop.satisfied(samples) or config.stop.exhausted(samples, time.monotonic() - t0) \
                or findings or time.monotonic() > deadline - 5:
            break
    if sides[0].tampered:
        findings.append((Category.TIMER_PATCH, "timing primitives replaced: " + ", ".join(sorted(sides[0].tampered))))
    if sides[0].persisting_l2:
        findings.append((Category.PERSISTING_L2, f"a timed call set up {sides[0].persisting_l2} (reset before each call)"))
    bound = wall_bound(sides[0], sides[1] if len(sides) > 1 else None)
    findings += bound.findings
    return _result(sides, findings, rechecked, time.monotonic() - t0, bound)


def _time_one_block(side: _Side, arena: SharedArena, config: TimerConfig, pool_len: int, recheck: int | None,
                    output_like: list[torch.Tensor], deadline: float) -> list[torch.Tensor] | None:
    buffers = [arena.empty(t.shape, t.dtype) for t in output_like] if recheck is not None else []
    command: dict[str, Any] = {"op": "time_block", "start": side.cursor, "n": config.block}
    if recheck is not None:
        command["recheck"] = {str(recheck): [h for _, h in buffers]}
    w0 = time.perf_counter()
    reply = side.sb.call(command, time_left(deadline))
    wall_ms = (time.perf_counter() - w0) * 1e3
    side.cursor = (side.cursor + config.block) % pool_len
    side.device_ms += [float(x) for x in reply["device_ms"]]
    side.host_ms += [float(x) for x in reply["host_ms"]]
    if recheck is None:
        side.parent_ms.append(wall_ms / config.block)
    side.tampered.update(reply.get("tampered", []))
    side.persisting_l2 = side.persisting_l2 or reply.get("persisting_l2")
    return [b for b, _ in buffers] if recheck is not None else None


@dataclass(frozen=True)
class WallBound:
    charge: float = 1.0
    findings: tuple[tuple[Category, str], ...] = ()
    notes: tuple[str, ...] = ()


def wall_bound(cand: _Side, base: _Side | None) -> WallBound:
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


IMPOSSIBLE_FACTOR = 2.0
CHARGE_RATIO = 1.15
CHARGE_SLACK_MS = 0.25
HACK_RATIO = 2.0


def _result(sides: list[_Side], findings: list[tuple[Category, str]], rechecked: int, elapsed: float,
            bound: WallBound) -> SpeedResult:
    stats = {s.name: _stats(s.device_ms) for s in sides if s.device_ms}
    cand = sides[0].device_ms
    speedups, cis = {}, {}
    for s in sides[1:]:
        if cand and s.device_ms:
            speedups[s.name] = median(s.device_ms) / max(median(cand), 1e-9) / bound.charge
            lo, hi = bootstrap_ratio_ci(s.device_ms, cand)
            cis[s.name] = (lo / bound.charge, hi / bound.charge)
    return SpeedResult(stats, speedups, cis, tuple(findings), rechecked, elapsed, bound.charge, bound.notes)


def _stats(samples: list[float]) -> TimingStats:
    base = TimingStats.of(samples)
    lo, hi = median_ci(samples)
    return TimingStats(base.mean_ms, base.median_ms, base.std_ms, base.min_ms, base.max_ms, base.n, lo, hi)


