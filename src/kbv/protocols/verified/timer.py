"""The verified protocol's timer, parent side: interleaved blocks, adaptive stopping, rechecks.

The candidate and each baseline live in their own child and hold the same pool of input sets (fresh
values, more bytes in total than the L2 cache). After a warm-up by time, the parent asks them in turn
(ABBA order) for blocks of timed calls; each call gets the next pool entry, a cold L2, and a
device-wide synchronise inside its timed window. Children report each call's whole window; the
window's own costs (the synchronise's return, the quickest launch: idle time) are measured by a
baseline's child, which runs no candidate code, right after each of its blocks, and the parent takes
them out of the calls of that round, the candidate's and the baselines' alike (`settle`). Sampling
stops once every median is known to the target precision, or at a cap. The speedup's interval is the
bootstrap's over the calls, widened by what two alike processes differ by, the host's share of each
side's windows included (`kbv.protocols.verified.spread`). A side whose calls are too short to time
against those costs gets no speedup (`kbv.detect.speed.too_short_to_time`). Before
any of it, every child stands as a profiled one does (a GPU's CUPTI, which a profiler session leaves
attached: `kbv.sandbox.child`). A random call of every candidate block has its output copied out and
checked against the truth. The parent's own wall clock around each block bounds what a child can
claim: a candidate whose time outside its timed calls exceeds the baseline's in the same rounds
beyond noise is charged the wall time, and one that exceeds it grossly is a hack, once fresh rounds
timed for the purpose agree (a busy machine can slow one side's blocks for a while). Primitives
re-bound by the candidate are reported by the child's clock.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.detect.speed import WallBlock, WallBound, too_short_to_time, wall_bound, window_resolution_ms
from kbv.errors import ProblemRunError
from kbv.inputs import tensor_bytes
from kbv.memory_plan import return_cached
from kbv.protocols.verified.spread import host_share, judge_speedups, process_note
from kbv.sandbox import Sandbox
from kbv.sandbox.timers import COST_PROBES, WindowCosts, subtract_costs
from kbv.settings import time_left
from kbv.stats import StopRule, interleave_order, median, median_ci
from kbv.verdict import Category, TimingStats


@dataclass(frozen=True)
class TimerConfig:
    stop: StopRule = field(default_factory=StopRule)
    block: int = 10  # calls per block
    warmup_ms: float = 200.0  # after the first (compiling) call
    rechecks_per_block: int = 1  # candidate outputs checked per (every other) block; 0: none (benches only)
    flush_factor: float = 2.0  # L2 flush = factor x L2 size
    pool_factor: float = 2.0  # pool bytes >= factor x L2 size
    max_pool_sets: int = 16
    # every process that times holds the whole pool (the parent, each baseline child, the candidate's):
    # above this many bytes, the pool stops adding distributions and keeps the L2 minimum (2 sets)
    pool_budget_bytes: int = 6 << 30
    # rounds timed again, without rechecks, before the wall clock names a mismatch (judged on all rounds)
    wall_retry_rounds: int = 8


@dataclass
class _Side:
    name: str
    sb: Sandbox
    whole_ms: list[float] = field(default_factory=list)  # per call, its whole window as reported
    stream_ms: list[float] = field(default_factory=list)  # per call, its own stream's part as reported
    launch_ms: list[float] = field(default_factory=list)  # per call, the host's time to its return as reported
    rounds: list[int] = field(default_factory=list)  # per call, the round it was timed in
    device_ms: list[float] = field(default_factory=list)  # per call, the window's costs taken out (`settle`)
    capped_rounds: int = 0  # rounds whose costs exceeded this side's quickest window (`settle`)
    host_ms: list[float] = field(default_factory=list)
    blocks: list[WallBlock] = field(default_factory=list)  # the parent's wall clock, per block
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
    window_costs_ms: tuple[float, float] | None = None  # (launch, sync) taken out, the medians over rounds
    clock_warmup: dict[str, Any] | None = None  # what warming the device's clocks before the window did (kbv.clocks)
    too_short: tuple[str, ...] = ()  # the sides whose calls were too short to time: no speedup involves them


def pool_size(bytes_per_set: int, l2_bytes: int, config: TimerConfig, distributions: int = 1) -> int:
    """How many input sets the timing pool holds: enough to exceed `pool_factor` x L2, and one per
    applicable distribution, as far as `pool_budget_bytes` allows; at least 2 (consecutive calls
    never share inputs)."""
    need = int(config.pool_factor * l2_bytes)
    per_set = max(bytes_per_set, 1)
    wanted = max(min(config.max_pool_sets, -(-need // per_set)), distributions)
    return max(2, min(wanted, config.pool_budget_bytes // per_set))


class PoolDrift(ProblemRunError):
    """A timing set drawn again from its seed came out other than it first did: the problem's inputs
    do not follow the seed (its own `get_inputs` draws from a generator kbv does not seed)."""


class TimingPool:
    """The timing pool's input sets as the parent sees them. Held: drawn once and kept between
    candidates (a small problem's). Not held: drawn again from their seeds whenever one is needed (a
    large problem's, where a set can be GBs): the parent then keeps no set beside the children's
    copies, and each child takes the pool a set at a time (`load_pool`). A set drawn again must be
    the set drawn first (its sums are compared), or the rechecks would judge the timed outputs
    against another input's truth: `PoolDrift` then, a failure of the problem."""

    def __init__(self, n: int, draw: Callable[[int], list[Any]], held: bool, first: list[Any] | None = None) -> None:
        self._draw: Callable[[int], list[Any]] | None = draw
        self._n = n
        self.held = held
        self._sums: dict[int, list[Any]] = {}  # a set's sums as first drawn (a pool not held)
        first = draw(0) if first is None else first
        if not held:
            self._sums[0] = input_sums(first)
        self.set_bytes = tensor_bytes(first)
        self._sets: list[list[Any]] | None = [first] + [draw(k) for k in range(1, n)] if held else None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k: int) -> list[Any]:
        if not -self._n <= k < self._n:
            raise IndexError(f"pool entry {k} of {self._n}")
        k %= self._n
        return self._sets[k] if self._sets is not None else self._drawn(k)

    def __iter__(self) -> Iterator[list[Any]]:
        return (self[k] for k in range(self._n))

    def _drawn(self, k: int) -> list[Any]:
        assert self._draw is not None
        inputs = self._draw(k)
        if k in self._sums:
            check_redrawn(inputs, self._sums[k], f"timing input set {k}")
        else:
            self._sums[k] = input_sums(inputs)
        return inputs

    def clear(self) -> None:
        self._sets, self._n, self._draw = [], 0, None


def input_sums(inputs: list[Any]) -> list[Any]:
    """What tells two draws of an input set apart: each tensor's shape, dtype and float64 sum (NaN as
    a string: NaN != NaN); other values as they are."""
    out: list[Any] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            total: Any = (complex(x.detach().sum(dtype=torch.complex128)) if x.is_complex()
                          else int(x.sum()) if x.dtype == torch.bool else float(x.detach().sum(dtype=torch.float64)))
            out.append((tuple(x.shape), str(x.dtype), repr(total)))
        else:
            out.append(repr(x))
    return out


def check_redrawn(inputs: list[Any], first: list[Any], what: str) -> None:
    """Raise PoolDrift where `inputs`, drawn again from their seed, are not what `first` (their
    `input_sums` when first drawn) says they were."""
    if input_sums(inputs) != first:
        raise PoolDrift(f"{what} drawn again from its seed differs from its first draw: the problem's "
                        "get_inputs does not follow torch's seed")


def load_pool(sb: Sandbox, pool: Sequence[list[Any]], flush_bytes: int, timeout_s: float) -> None:
    """Hand the pool's input sets to the child `sb` and have it allocate the L2 flush: a held pool in
    one transfer; one the parent does not hold a set at a time, each drawn, handed over and dropped
    (the parent and the child's transfer never hold more than one set)."""
    if getattr(pool, "held", True):
        flat = [x for inputs in pool for x in inputs]
        refs = iter(sb.put(flat, timeout_s))
        sets = [[next(refs) for _ in inputs] for inputs in pool]
        sb.call({"op": "pool", "pool": sets, "flush_bytes": flush_bytes}, timeout_s)
        return
    for k in range(len(pool)):
        drawn = pool[k]
        handed = sb.put(drawn, timeout_s)
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in drawn)
        del drawn
        if on_cuda:  # the set drawn for the transfer, which the child has now: not kept in the parent's cache
            return_cached("cuda")
        sb.call({"op": "pool", "pool": [handed], "flush_bytes": flush_bytes, "append": k > 0}, timeout_s)
        del handed


@dataclass(frozen=True)
class _Run:
    """What every block of one measurement shares."""

    config: TimerConfig
    pool_len: int
    output_like: list[torch.Tensor]  # the outputs' shapes and dtypes, for a recheck's copy
    deadline: float  # time.monotonic()
    prober: str | None  # the side whose child measures the window's costs: a baseline's, no candidate code
    costs: dict[int, WindowCosts] = field(default_factory=dict)  # round -> the costs measured beside its blocks


def measure_speed(candidate: Sandbox, baselines: dict[str, Sandbox], config: TimerConfig,
                  pool_len: int, check: Callable[[int, list[torch.Tensor]], str | None],
                  output_like: list[torch.Tensor], deadline: float) -> SpeedResult:
    """Time the candidate against every baseline (all already hold the pool). `check(pool_index,
    outputs)` returns why a timed output is wrong, or None; `output_like` gives the outputs' shapes
    and dtypes (meta tensors will do)."""
    t0 = time.monotonic()
    sides = [_Side("candidate", candidate)] + [_Side(n, sb) for n, sb in baselines.items()]
    for side in sides:  # every child as a profiled one stands (the candidate's is, by its attribution)
        side.sb.call({"op": "warmup", "ms": config.warmup_ms, "profiled": True}, time_left(deadline))
    run = _Run(config, pool_len, output_like, deadline, sides[1].name if len(sides) > 1 else None)
    rng = random.Random(0x7137)
    findings: list[tuple[Category, str]] = []
    rechecked = 0
    rnd = 0
    while True:
        for i in interleave_order(len(sides), rnd):
            side = sides[i]
            # every other candidate block copies one output out for a recheck; the copy (a device-to-
            # host transfer into fresh shared memory) is slow, so those blocks do not feed the wall clock
            recheck = (rng.randrange(config.block) if config.rechecks_per_block and side.name == "candidate"
                       and rnd % 2 == 1 else None)
            outs = _time_one_block(run, side, rnd, recheck)
            if outs is not None:
                rechecked += 1
                index = (side.cursor - config.block + recheck) % pool_len
                why = check(index, outs)
                if why:
                    findings.append((Category.RESULT_CACHE, f"a timed call returned a wrong output: {why}"))
        rnd += 1
        _settle(sides, run.costs)
        samples = [s.device_ms for s in sides]
        if config.stop.satisfied(samples) or config.stop.exhausted(samples, time.monotonic() - t0) \
                or findings or time_left(deadline, floor_s=0.0) < 5:
            break
    bound = wall_bound(sides[0], sides[1] if len(sides) > 1 else None)
    if bound.findings:
        bound = _time_again(run, sides, rnd)
    if sides[0].tampered:
        findings.append((Category.TIMER_PATCH, "timing primitives replaced: " + ", ".join(sorted(sides[0].tampered))))
    if sides[0].persisting_l2:
        findings.append((Category.PERSISTING_L2, f"a timed call set up {sides[0].persisting_l2} (reset before each call)"))
    findings += bound.findings
    return _result(sides, findings, rechecked, time.monotonic() - t0, bound, run.costs)


def _time_again(run: _Run, sides: list[_Side], rnd: int) -> WallBound:
    """The wall clock's judgement once more rounds are timed (no rechecks: every block feeds the
    wall clock), on all rounds: load from other work can slow one side's blocks for a while, while
    a candidate that hides work outside its timed calls does so in the new rounds too."""
    until = time.monotonic() + min(run.config.stop.max_time_s, time_left(run.deadline, floor_s=0.0) - 5)
    for r in range(rnd, rnd + run.config.wall_retry_rounds):
        if time.monotonic() > until:
            break
        for i in interleave_order(len(sides), r):
            _time_one_block(run, sides[i], r, None)
    _settle(sides, run.costs)
    return wall_bound(sides[0], sides[1])


def _time_one_block(run: _Run, side: _Side, rnd: int, recheck: int | None) -> list[torch.Tensor] | None:
    """One block of `side` in round `rnd`; the outputs of call `recheck`, copied out, if asked for."""
    n = run.config.block
    probe = side.name == run.prober
    command: dict[str, Any] = {"op": "time_block", "start": side.cursor, "n": n, "costs": None,
                               "probe_costs": COST_PROBES if probe else 0}
    receipt = None
    if recheck is not None:
        fields, receipt = side.sb.expect(run.output_like)
        command["recheck"] = {str(recheck): fields}
    w0 = time.perf_counter()
    reply = side.sb.call(command, time_left(run.deadline))
    wall_ms = (time.perf_counter() - w0) * 1e3
    side.cursor = (side.cursor + n) % run.pool_len
    whole = [float(x) for x in reply["device_ms"]]  # nothing taken out: the command sent no costs
    stream = [float(x) for x in reply.get("stream_ms", whole)]
    side.whole_ms += whole
    side.stream_ms += stream if len(stream) == len(whole) else whole
    # one per call, in line with the others whatever the reply holds: a call without one has none (0)
    launch = [_ms(x) for x in reply.get("launch_ms", ())]
    side.launch_ms += launch if len(launch) == len(whole) else [0.0] * len(whole)
    side.rounds += [rnd] * len(whole)
    side.host_ms += [float(x) for x in reply["host_ms"]]
    if probe and (costs := _window_costs(reply.get("window_costs_ms"))) is not None:
        run.costs[rnd] = costs
        # the probes are the harness's, after the block's calls: they are no time the baseline's calls
        # spent outside their windows, which the candidate's are judged against (`wall_bound`)
        wall_ms -= min(max(_ms(reply.get("probe_ms")), 0.0), wall_ms)
    if recheck is None:
        side.blocks.append(WallBlock(rnd, wall_ms / n, median(whole) if whole else 0.0))
    side.tampered.update(reply.get("tampered", []))
    side.persisting_l2 = side.persisting_l2 or reply.get("persisting_l2")
    if receipt is None:
        return None
    outs = side.sb.take(reply, receipt, time_left(run.deadline))
    return outs if outs is not None else []


def _settle(sides: list[_Side], measured: Mapping[int, WindowCosts]) -> None:
    """Every side's calls with the window's costs taken out (`settle`), round by round; a round whose
    measurement is missing takes the median of the others'."""
    costs = fill_rounds(measured, {r for s in sides for r in s.rounds})
    for side in sides:
        side.device_ms, side.capped_rounds = settle(side.whole_ms, side.stream_ms, side.rounds, costs)


def fill_rounds(measured: Mapping[int, WindowCosts], rounds: set[int]) -> dict[int, WindowCosts]:
    """`measured` with every round of `rounds` it lacks given the medians of its figures (none at all,
    as on a CPU: empty). Pure."""
    typical = _typical(measured.values())
    if typical is None:
        return {}
    return {r: measured.get(r, typical) for r in rounds}


def settle(whole_ms: Sequence[float], stream_ms: Sequence[float], rounds: Sequence[int],
           costs: Mapping[int, WindowCosts]) -> tuple[list[float], int]:
    """One side's calls (whole windows, own-stream parts, rounds) with the window's own costs taken
    out, and the number of its rounds whose measured costs were too large to take out. Pure.

    Why this is sound: the costs are idle time of the device's (its wait for the host's launch path,
    the synchronise's return), measured by a child that runs no candidate code right beside the
    blocks they correct, as the least of several probes, so load on the host that lengthens both the
    calls and the costs of a round is taken out of that round, and a moment of load that lengthened
    the probes alone is neither carried to other rounds nor taken out whole. A round's costs above
    the side's own quickest window of that round were lengthened so (that window held the costs and
    the call both): that round takes the typical costs (the medians over rounds) instead, never more
    than its quickest window, and is counted, so that a side whose calls are shorter than the costs'
    jitter is too short to time (`kbv.detect.speed.too_short_to_time`), never 0. Without costs for
    a round (a CPU), its calls are their whole windows."""
    out = list(whole_ms)
    capped = 0
    typical = _typical(costs.values())
    by_round: dict[int, list[int]] = {}
    for i, rnd in enumerate(rounds):
        by_round.setdefault(rnd, []).append(i)
    for rnd, mine in by_round.items():
        cost = costs.get(rnd)
        if cost is None or typical is None:
            continue
        quickest = min(whole_ms[i] for i in mine)
        if cost.launch + cost.sync > quickest:
            capped += 1
            cost = typical
        take = min(cost.launch + cost.sync, quickest)
        launch = min(cost.launch, take)
        for i in mine:
            out[i] = subtract_costs(whole_ms[i], stream_ms[i], launch, take - launch)
    return out, capped


def _typical(costs: Iterable[WindowCosts]) -> WindowCosts | None:
    """The medians of `costs`' launches and synchronises (None without any)."""
    known = list(costs)
    if not known:
        return None
    return WindowCosts(median([c.launch for c in known]), median([c.sync for c in known]))


def _result(sides: list[_Side], findings: list[tuple[Category, str]], rechecked: int, elapsed: float,
            bound: WallBound, measured: Mapping[int, WindowCosts]) -> SpeedResult:
    stats = {s.name: _stats(s.device_ms) for s in sides if s.device_ms}
    costs = fill_rounds(measured, {r for s in sides for r in s.rounds})
    totals = [c.launch + c.sync for c in costs.values()]
    resolution = window_resolution_ms(totals)
    typical = _typical(costs.values())
    taken = typical.launch + typical.sync if typical is not None else None
    short = {s.name: why for s in sides if s.device_ms and (why := too_short_to_time(
        s.name, stats[s.name].median_ms, s.capped_rounds, len(set(s.rounds)), resolution, taken))}
    host = {s.name: host_share(typical, s.launch_ms, s.stream_ms, s.whole_ms) for s in sides}  # "candidate" first
    speedups, cis = judge_speedups(sides[0].device_ms, {s.name: s.device_ms for s in sides[1:]}, bound.charge,
                                   set(short), host)
    notes = bound.notes + tuple(short.values())
    if cis:
        notes += (process_note(host),)
    if short:
        notes += (f"no speedup where a side was too short to time ({', '.join(short)})",)
    if typical is not None:
        notes += (f"the window's own costs, taken out of every call: the quickest launch "
                  f"{typical.launch * 1e3:.1f} us, the synchronise's return {typical.sync * 1e3:.1f} us (medians "
                  f"over {len(costs)} rounds of the least of {COST_PROBES} probes beside each; taking them out "
                  f"is unsure by {resolution * 1e3:.1f} us)",)
    summary = (typical.launch, typical.sync) if typical is not None else None
    return SpeedResult(stats, speedups, cis, tuple(findings), rechecked, elapsed, bound.charge, notes, summary,
                       too_short=tuple(short))


def _ms(said: Any) -> float:
    """A figure of a child's reply in ms (0 where it is not a finite number)."""
    ok = isinstance(said, (int, float)) and not isinstance(said, bool) and math.isfinite(said)
    return float(said) if ok else 0.0


def _window_costs(said: Any) -> WindowCosts | None:
    """(launch, sync) ms from the baseline child's reply, if they are plausible figures (under 1 ms)."""
    if isinstance(said, list) and len(said) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x < 1.0 for x in said):
        return WindowCosts(float(said[0]), float(said[1]))
    return None


def _stats(samples: list[float]) -> TimingStats:
    base = TimingStats.of(samples)
    lo, hi = median_ci(samples)
    return TimingStats(base.mean_ms, base.median_ms, base.std_ms, base.min_ms, base.max_ms, base.n, lo, hi)


