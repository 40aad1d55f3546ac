"""Timers. They run inside a sandbox child (candidate or baseline alike), on primitives bound
before any candidate code is imported.

`time_kernelbench` is KernelBench's timer (`kernelbench.timing`), by the method its config names:
- `cuda_event` (KernelBench's default): a few warm-up calls (synchronised each), then for every trial
  a fresh event pair around one call, with an L2 flush (a 256 MiB fill) just before the start event,
  no synchronise between the two, and a device synchronise after the end event; the first trial is
  discarded;
- `host_time`: the same loop on the host's clock, from just after the flush is launched to the return
  of the device synchronise after the call (so the flush's remaining device time is inside it);
- `do_bench`: Triton's `do_bench` as KernelBench calls it (25 ms warm-up, 100 ms of repetitions, every
  time returned): one call, an estimate from five flushed calls in one event pair, warm-up and
  repetition counts from it, then per repetition a flush (a 256 MiB zero) and an event pair around
  the call, with one synchronise after the last.
Beside the samples it reports the host's time of each timed call's Python part (the wall time from
just before the call to its return, before any synchronise) and the flush's own device time, from a
few flushes alone on an idle device: where the two are comparable, how much of the call's host path
hides under the flush is a race (`kbv.protocols.standard` marks it). On CPU the same loops run on a
host clock, without a flush.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

KERNELBENCH_FLUSH_BYTES = 256 << 20
STANDARD_TIMINGS = ("cuda_event", "do_bench", "host_time")  # KernelBench's methods a child can run
DO_BENCH_WARMUP_MS, DO_BENCH_REP_MS = 25.0, 100.0  # Triton's defaults, which KernelBench keeps
# do_bench's repetitions at most. Triton has none: its estimate includes the flush, so on a GPU the
# count stays near 100 ms / flush time (~1,500 on an H200), but a microsecond call on a CPU would
# otherwise send 10^5 samples back
DO_BENCH_MAX_REPEATS = 10_000
FLUSH_PROBES = 10  # flushes timed alone, for the flush's device time


class Clock:
    """Timing primitives, bound at construction: later monkey-patching does not reach them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.perf_counter = time.perf_counter
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.Event = torch.cuda.Event
            self.synchronize = torch.cuda.synchronize
            self.record = torch.cuda.Event.record
            self.elapsed_time = torch.cuda.Event.elapsed_time
            self.current_stream = torch.cuda.current_stream
        self.l2 = _bind_l2() if self.cuda else None
        self._bound = self._current()

    def _current(self) -> dict[str, Any]:
        cur: dict[str, Any] = {"time.perf_counter": time.perf_counter}
        if self.cuda:
            cur.update({
                "torch.cuda.Event": torch.cuda.Event,
                "torch.cuda.synchronize": torch.cuda.synchronize,
                "torch.cuda.Event.record": torch.cuda.Event.record,
                "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
            })
        return cur

    def tampered(self) -> list[str]:
        """Names of timing primitives that are no longer the objects bound at construction, in the
        modules or on this clock itself."""
        now = self._current()
        changed = [k for k, v in self._bound.items() if now.get(k) is not v]
        mine = {"time.perf_counter": "perf_counter", "torch.cuda.Event": "Event",
                "torch.cuda.synchronize": "synchronize", "torch.cuda.Event.record": "record",
                "torch.cuda.Event.elapsed_time": "elapsed_time"}
        for key, attr in mine.items():
            if key in self._bound and self.__dict__.get(attr) is not self._bound[key]:
                changed.append(f"Clock.{attr}")
        return changed

    def sync(self) -> None:
        if self.cuda:
            self.synchronize()

    def persisting_l2(self) -> str | None:
        """What persisting-L2 state the last call left behind (see kbv.sandbox.l2), or None."""
        if self.l2 is None:
            return None
        return self.l2.state(self.current_stream().cuda_stream).evidence()


def _bind_l2() -> Any:
    from kbv.sandbox.l2 import PersistingL2

    return PersistingL2.bind()


@dataclass(frozen=True)
class StandardTimerConfig:
    """KernelBench's timing parameters (scripts' values) and method (one of STANDARD_TIMINGS)."""

    warmup: int = 3
    trials: int = 100
    discard_first: int = 1
    flush_bytes: int = KERNELBENCH_FLUSH_BYTES
    method: str = "cuda_event"


@dataclass(frozen=True)
class StandardSamples:
    """What KernelBench's timer measured: the samples its method reports (ms), the host's time of each
    timed call's Python part (ms), and the flush's own device time (median ms; None on a CPU)."""

    samples_ms: list[float]
    host_ms: list[float]
    flush_ms: float | None = None


def time_kernelbench(clock: Clock, fn: Callable[..., Any], args: Sequence[Any],
                     config: StandardTimerConfig) -> StandardSamples:
    """Per-call times in ms by KernelBench's `config.method` (see module docstring). Raises
    ValueError for a method it does not know."""
    if config.method not in STANDARD_TIMINGS:
        raise ValueError(f"unknown standard timing method {config.method!r}; expected {STANDARD_TIMINGS}")
    if config.method == "do_bench":
        return _time_do_bench(clock, fn, args, config)
    for _ in range(config.warmup):
        fn(*args)
        clock.sync()
    if not clock.cuda:
        return _time_host(clock, fn, args, config)
    torch.cuda.empty_cache()
    flush = torch.empty(config.flush_bytes // 8, dtype=torch.int64, device=clock.device)
    loop = _time_cuda_events if config.method == "cuda_event" else _time_host_synchronised
    samples, host = loop(clock, fn, args, config.trials + config.discard_first, flush)
    flush_ms = _flush_ms(clock, lambda: flush.fill_(42))
    del flush
    return StandardSamples(samples[config.discard_first:], host[config.discard_first:], flush_ms)


def _time_cuda_events(clock: Clock, fn: Callable[..., Any], args: Sequence[Any], n: int,
                      flush: torch.Tensor) -> tuple[list[float], list[float]]:
    samples, host = [], []
    for _ in range(n):
        clock.synchronize()
        start, end = clock.Event(enable_timing=True), clock.Event(enable_timing=True)
        flush.fill_(42)
        clock.record(start)  # no synchronise after the flush: the call's host path runs beside it
        t0 = clock.perf_counter()
        fn(*args)
        t1 = clock.perf_counter()
        clock.record(end)
        clock.synchronize()
        samples.append(float(clock.elapsed_time(start, end)))
        host.append((t1 - t0) * 1e3)
    return samples, host


def _time_host_synchronised(clock: Clock, fn: Callable[..., Any], args: Sequence[Any], n: int,
                            flush: torch.Tensor) -> tuple[list[float], list[float]]:
    """KernelBench's `host_time`: the flush is launched, then the host's clock runs from just before
    the call to the return of the device synchronise after it."""
    samples, host = [], []
    for _ in range(n):
        clock.synchronize()
        flush.fill_(42)
        t0 = clock.perf_counter()
        fn(*args)
        t1 = clock.perf_counter()
        clock.synchronize()
        t2 = clock.perf_counter()
        samples.append((t2 - t0) * 1e3)
        host.append((t1 - t0) * 1e3)
    return samples, host


def _time_do_bench(clock: Clock, fn: Callable[..., Any], args: Sequence[Any],
                   config: StandardTimerConfig) -> StandardSamples:
    """Triton's `do_bench(fn, warmup=25, rep=100, return_mode="all")`, on this clock's primitives."""
    fn(*args)
    clock.sync()
    cache = torch.empty(config.flush_bytes // 4, dtype=torch.int32, device=clock.device) if clock.cuda else None
    estimate_ms = _do_bench_estimate(clock, fn, args, cache)
    # Triton divides without a guard; a call too quick to measure gets its cudagraph variant's 1000
    n_warmup = max(1, int(DO_BENCH_WARMUP_MS / estimate_ms)) if estimate_ms > 0 else 1000
    n_repeat = max(1, int(DO_BENCH_REP_MS / estimate_ms)) if estimate_ms > 0 else 1000
    n_repeat = min(n_repeat, DO_BENCH_MAX_REPEATS)
    for _ in range(n_warmup):  # no flush, no synchronise
        fn(*args)
    if cache is None:
        return _time_host(clock, fn, args, StandardTimerConfig(trials=n_repeat, discard_first=0))
    starts = [clock.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [clock.Event(enable_timing=True) for _ in range(n_repeat)]
    host = []
    for start, end in zip(starts, ends):
        cache.zero_()
        clock.record(start)
        t0 = clock.perf_counter()
        fn(*args)
        t1 = clock.perf_counter()
        clock.record(end)
        host.append((t1 - t0) * 1e3)
    clock.synchronize()  # once, after the last repetition
    samples = [float(clock.elapsed_time(s, e)) for s, e in zip(starts, ends)]
    flush_ms = _flush_ms(clock, cache.zero_)
    del cache
    return StandardSamples(samples, host, flush_ms)


def _do_bench_estimate(clock: Clock, fn: Callable[..., Any], args: Sequence[Any], cache: torch.Tensor | None) -> float:
    """do_bench's estimate of one call (ms): five calls, each after a flush, in one window."""
    if cache is None:
        t0 = clock.perf_counter()
        for _ in range(5):
            fn(*args)
        return (clock.perf_counter() - t0) * 1e3 / 5
    start, end = clock.Event(enable_timing=True), clock.Event(enable_timing=True)
    clock.record(start)
    for _ in range(5):
        cache.zero_()
        fn(*args)
    clock.record(end)
    clock.synchronize()
    return float(clock.elapsed_time(start, end)) / 5


def _time_host(clock: Clock, fn: Callable[..., Any], args: Sequence[Any],
               config: StandardTimerConfig) -> StandardSamples:
    samples = []
    for _ in range(config.trials + config.discard_first):
        t0 = clock.perf_counter()
        fn(*args)
        samples.append((clock.perf_counter() - t0) * 1e3)
    kept = samples[config.discard_first:]
    return StandardSamples(kept, list(kept))  # on a CPU the call is all host


def _flush_ms(clock: Clock, flush: Callable[[], Any], repeats: int = FLUSH_PROBES) -> float:
    """The flush's device time (median ms): each flush alone between two events on an idle device."""
    times = []
    for _ in range(repeats):
        clock.synchronize()
        start, end = clock.Event(enable_timing=True), clock.Event(enable_timing=True)
        clock.record(start)
        flush()
        clock.record(end)
        clock.synchronize()
        times.append(float(clock.elapsed_time(start, end)))
    return statistics.median(times)


# -- the verified protocol's timer (child side) -------------------------------------------------

@dataclass(frozen=True)
class BlockResult:
    device_ms: list[float]  # per call: begin -> done, less the window's costs where given (host time on CPU)
    host_ms: list[float]  # host wall time per call, flush excluded
    persisting_l2: str | None = None  # what a call set up, though it was reset before each call
    stream_ms: list[float] = field(default_factory=list)  # per call: begin -> end, its own stream (host time on CPU)
    # per call: the host's time from just before `begin` to the call's return (CUDA; empty on a CPU), its
    # launch path: where the device waited on it, what a process's own speed moves (`kbv.protocols.verified.spread`)
    launch_ms: list[float] = field(default_factory=list)


def warm_up(clock: Clock, fn: Callable[..., Any], pool: Sequence[Sequence[Any]], min_ms: float,
            min_calls: int = 3, max_calls: int = 10_000) -> int:
    """Call `fn` over the pool until `min_ms` of wall time and `min_calls` calls have passed (the first
    call, which compiles and autotunes, counts as a call but its time does not)."""
    fn(*pool[0])
    clock.sync()
    t0 = clock.perf_counter()
    calls = 1
    while calls < max_calls and (calls < min_calls or (clock.perf_counter() - t0) * 1e3 < min_ms):
        fn(*pool[calls % len(pool)])
        clock.sync()
        calls += 1
    return calls


@dataclass(frozen=True)
class WindowCosts:
    """What a timed window costs by itself (ms; see `measure_window_costs`). Both are time the device
    spends idle (but for the fill's own microsecond or so), so taking them out hides no work worth
    having: `launch`, from the start event to the end of the quickest call the host can launch (a
    one-element fill, the device waiting on the host's launch path all the while); `sync`, from an
    event the device has reached to one recorded once the device-wide synchronise has returned."""

    launch: float
    sync: float


@dataclass(frozen=True)
class Window:
    """How the calls of a block are timed: the L2 flush buffer (None: no flush, as on a CPU) and the
    window's own costs to take out of every call (None: none taken out)."""

    flush: torch.Tensor | None = None
    costs: WindowCosts | None = None


COST_PROBES = 8  # probes of the window's costs beside each block of a baseline's (the least of them counts)


def measure_window_costs(clock: Clock, repeats: int = COST_PROBES) -> WindowCosts:
    """The timed window's own costs, measured as a call pays them (CUDA): the LEAST of `repeats`
    probes of each, never a median. Both are host latencies, which a moment of load on the host (a
    neighbour's process, an interrupt) can only lengthen: the quickest probe is what the window cost
    when nothing got in its way, so no more is taken out of a call than every call certainly paid.
    A median taken while the host was busy was measured at 75 us on an H100 where a few us is normal,
    and took whole microsecond-long calls out with it."""
    a, b, c = (clock.Event(enable_timing=True) for _ in range(3))
    tiny = torch.empty(1, dtype=torch.int32, device=clock.device)
    launch, sync = [], []
    for _ in range(max(1, repeats)):
        clock.synchronize()
        clock.record(a)
        tiny.fill_(1)
        clock.record(b)
        clock.synchronize()
        clock.record(c)
        clock.synchronize()
        launch.append(float(clock.elapsed_time(a, b)))
        sync.append(float(clock.elapsed_time(b, c)))
    return WindowCosts(min(launch), min(sync))


def time_block(clock: Clock, fn: Callable[..., Any], pool: Sequence[Sequence[Any]], start: int, n: int,
               window: Window, on_output: Callable[[int, Any], None] | None = None) -> BlockResult:
    """Time `n` calls on pool entries start, start+1, ... (CUDA; a host clock on a CPU). Each call:
    synchronise, no persisting L2, the L2 flush, synchronise again (nothing of ours runs beside the
    call, and no work of the call's can hide under the flush), then on the device: the `begin`
    event, the call, the `end` event on the call's stream, a DEVICE-WIDE synchronise, the `done`
    event. Then what persisting-L2 state the call set up.

    A call's time is begin -> done, so work on every stream counts, less the window's own costs
    (`window.costs`: the synchronise's return and the quickest launch, idle time both), and never
    less than begin -> end less the launch: what its own stream did (`subtract_costs`). Without
    costs, begin -> done whole: the parent then takes out the costs measured beside the block. Each
    call's begin -> end comes back too (`stream_ms`), and the host's time to the call's return
    (`launch_ms`)."""
    device_ms, host_ms, stream_ms, launch_ms = [], [], [], []
    persisting = None
    events = [clock.Event(enable_timing=True) for _ in range(3)] if clock.cuda else []
    for i in range(n):
        args = pool[(start + i) % len(pool)]
        clock.sync()
        if clock.l2 is not None:
            clock.l2.reset()
        if clock.cuda:
            if window.flush is not None:
                window.flush.zero_()
                clock.synchronize()
            begin, end, done = events
            t0 = clock.perf_counter()
            clock.record(begin)
            out = fn(*args)
            t1 = clock.perf_counter()
            clock.record(end)
            clock.synchronize()
            clock.record(done)
            clock.synchronize()
            host_ms.append((clock.perf_counter() - t0) * 1e3)
            launch_ms.append((t1 - t0) * 1e3)
            stream_ms.append(float(clock.elapsed_time(begin, end)))
            device_ms.append(_call_ms(clock, begin, end, done, window.costs))
            persisting = persisting or clock.persisting_l2()
        else:
            t0 = clock.perf_counter()
            out = fn(*args)
            host_ms.append((clock.perf_counter() - t0) * 1e3)
            device_ms.append(host_ms[-1])
            stream_ms.append(host_ms[-1])
        if on_output is not None:
            on_output(i, out)
        del out
    return BlockResult(device_ms, host_ms, persisting, stream_ms, launch_ms)


def _call_ms(clock: Clock, begin: Any, end: Any, done: Any, costs: WindowCosts | None) -> float:
    """begin -> done less the window's own costs, at least begin -> end less the launch."""
    whole = float(clock.elapsed_time(begin, done))
    if costs is None:
        return whole
    return subtract_costs(whole, float(clock.elapsed_time(begin, end)), costs.launch, costs.sync)


def subtract_costs(whole_ms: float, stream_ms: float, launch_ms: float, sync_ms: float) -> float:
    """One call's time: its whole window (begin -> done) less the window's own costs, and never less
    than what its own stream did (begin -> end) less the launch, nor less than 0. Pure."""
    return max(whole_ms - sync_ms - launch_ms, stream_ms - launch_ms, 0.0)


def copy_bandwidth(clock: Clock, nbytes: int, repeats: int = 5) -> float:
    """GB/s (bytes read plus bytes written) of the best of `repeats` device-to-device copies."""
    src = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=clock.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    clock.sync()
    best = float("inf")
    for _ in range(repeats):
        if clock.cuda:
            begin, end = clock.Event(enable_timing=True), clock.Event(enable_timing=True)
            clock.record(begin)
            dst.copy_(src)
            clock.record(end)
            clock.synchronize()
            seconds = float(clock.elapsed_time(begin, end)) * 1e-3
        else:
            t0 = clock.perf_counter()
            dst.copy_(src)
            seconds = clock.perf_counter() - t0
        best = min(best, max(seconds, 1e-9))
    return 2 * src.numel() * src.element_size() / best / 1e9
