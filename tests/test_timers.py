"""The timed window (kbv.sandbox.timers): a call is timed from its start event to an event recorded
after the device-wide synchronise, so work on every stream counts, less the window's own costs (idle
time only: the quickest launch, the synchronise's return), and never less than what its own stream
did; the events come in that order around the call."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from kbv.sandbox.timers import (
    FLUSH_PROBES,
    StandardTimerConfig,
    Window,
    WindowCosts,
    _call_ms,
    subtract_costs,
    time_block,
    time_kernelbench,
)


@dataclass
class Stamp:
    ms: float = 0.0  # when the device reached the event


class FakeDevice:
    """Stands for the child's Clock on a GPU: events stamped with a device clock that advances by what
    the host asks (launch latency, the call's work, the synchronise's return)."""

    cuda = True
    l2 = None

    def __init__(self, call_ms: float, side_ms: float = 0.0, host_ms: float = 0.0) -> None:
        self.now = 0.0
        self.call_ms, self.side_ms, self.host_ms = call_ms, side_ms, host_ms  # host_ms: the call's own launch path
        self.log: list[str] = []
        self.busy_until = 0.0

    def Event(self, enable_timing: bool) -> Stamp:  # noqa: N802 - the torch name
        return Stamp()

    def record(self, event: Stamp) -> None:
        self.now = max(self.now, self.stream_until) + 0.002  # the device reaches it once its stream is done
        event.ms = self.now
        self.log.append("record")

    stream_until = 0.0

    def synchronize(self) -> None:
        self.now = max(self.now, self.stream_until, self.busy_until) + 0.015
        self.log.append("sync")

    def sync(self) -> None:
        self.synchronize()

    def perf_counter(self) -> float:
        return self.now / 1e3

    def elapsed_time(self, a: Stamp, b: Stamp) -> float:
        return b.ms - a.ms

    def persisting_l2(self) -> None:
        return None

    def fn(self) -> None:
        self.now += self.host_ms  # the host's time in the call before it returns (its ops' launches)
        start = self.now + 0.005  # the host's launch path
        self.stream_until = start + self.call_ms
        self.busy_until = start + self.side_ms  # work on a stream the current one never waits for
        self.log.append("call")


COSTS = WindowCosts(launch=0.007, sync=0.017)


def test_a_call_on_its_own_stream_is_timed_without_the_windows_own_costs():
    dev = FakeDevice(call_ms=1.0)
    [ms] = time_block(dev, dev.fn, [[]], 0, 1, Window(None, COSTS)).device_ms
    assert abs(ms - 1.0) < 0.005


def test_a_calls_launch_path_is_reported_beside_its_window():
    """A call whose ops the host launches one by one (a small network) holds the device for its launch
    path: the host's time to the call's return comes back per call, which a one-kernel call's does not
    (what alike processes differ by follows it: kbv.protocols.verified.spread.host_share)."""
    slow = time_block(dev := FakeDevice(call_ms=0.01, host_ms=0.12), dev.fn, [[]], 0, 2, Window(None, COSTS))
    quick = time_block(dev := FakeDevice(call_ms=2.0), dev.fn, [[]], 0, 2, Window(None, COSTS))
    assert slow.launch_ms == pytest.approx([0.122, 0.122], abs=1e-9) and slow.stream_ms[0] > 0.12
    assert quick.launch_ms == pytest.approx([0.002, 0.002], abs=1e-9) and quick.stream_ms[0] > 2.0


def test_work_on_a_side_stream_counts_however_short_or_long():
    for side in (0.004, 0.5, 3.0):  # past the call's own stream by a little or a lot
        dev = FakeDevice(call_ms=0.001, side_ms=0.001 + side)
        [ms] = time_block(dev, dev.fn, [[]], 0, 1, Window(None, COSTS)).device_ms
        assert ms >= 0.001 + side - 0.005, (side, ms)


def test_the_events_come_in_order_around_the_call_with_nothing_of_ours_beside_it():
    dev = FakeDevice(call_ms=0.1)
    time_block(dev, dev.fn, [[]], 0, 1, Window(None, COSTS))
    assert dev.log == ["sync", "record", "call", "record", "sync", "record", "sync"]


def test_without_costs_the_whole_window_counts_and_never_less_than_the_calls_own_stream():
    assert _call_ms(FakeDevice(1.0), Stamp(0.0), Stamp(1.0), Stamp(1.020), None) == 1.020
    # a synchronise that returned early (jitter) never makes a call shorter than its own stream
    assert _call_ms(FakeDevice(1.0), Stamp(0.0), Stamp(1.0), Stamp(1.001), COSTS) == 1.0 - COSTS.launch


def test_taking_costs_out_never_leaves_less_than_the_calls_own_stream_or_zero():
    # an H100 idle: 5 us of kernel inside a 19 us window whose costs are 6 + 8 us
    assert subtract_costs(0.019, 0.011, 0.006, 0.008) == pytest.approx(0.005)
    # costs measured while a second kbv run loaded the host (75 and 68 us) against the same call:
    # the arithmetic alone floors at the own stream less the launch, then at 0 (`settle` caps them first)
    assert subtract_costs(0.019, 0.011, 0.0749, 0.0684) == 0.0
    assert subtract_costs(0.019, 0.090, 0.0749, 0.0684) == pytest.approx(0.090 - 0.0749)


def test_the_window_costs_are_the_least_of_their_probes():
    """A probe that a busy host delayed does not count: the quickest probe is what the window cost."""
    from kbv.sandbox.timers import measure_window_costs

    dev = FakeDevice(call_ms=0.0)
    late = [0.060, 0.0, 0.070, 0.0, 0.050, 0.0, 0.0, 0.065]  # per probe: the host back late from its synchronise
    delays = iter(d for probe in late for d in (0.0, probe, 0.0))  # three synchronises a probe, the second timed
    synchronize = dev.synchronize

    def busy_synchronize() -> None:
        synchronize()
        dev.now += next(delays, 0.0)

    dev.synchronize = busy_synchronize  # type: ignore[method-assign]
    dev.device = torch.device("cpu")
    costs = measure_window_costs(dev, repeats=len(late))
    assert costs.launch == pytest.approx(0.002) and costs.sync == pytest.approx(0.015 + 0.002)


# -- KernelBench's timer, by method (the standard protocol) --------------------------------------

class FakeGpu(FakeDevice):
    """FakeDevice with a device for the flush buffer (a small CPU tensor stands for it), whose calls
    queue on the stream behind the ones before (do_bench launches without synchronising)."""

    device = torch.device("cpu")

    def fn(self) -> None:
        self.stream_until = max(self.now + 0.005, self.stream_until) + self.call_ms
        self.log.append("call")


SMALL_FLUSH = StandardTimerConfig(flush_bytes=1024)


def test_cuda_event_starts_its_window_right_after_the_flush_and_measures_the_host_path() -> None:
    dev = FakeGpu(call_ms=0.5)
    timed = time_kernelbench(dev, dev.fn, [], SMALL_FLUSH)
    assert len(timed.samples_ms) == len(timed.host_ms) == 100  # 101 trials, the first discarded
    assert all(abs(ms - 0.5) < 0.01 for ms in timed.samples_ms)
    trial = ["sync", "record", "call", "record", "sync"]  # no synchronise between the flush and the start
    assert dev.log[:6] == ["call", "sync"] * 3 and dev.log[6:11] == trial
    assert timed.flush_ms is not None  # timed alone, after the trials


def test_host_time_runs_its_clock_to_the_synchronise_after_the_call() -> None:
    dev = FakeGpu(call_ms=0.5)
    timed = time_kernelbench(dev, dev.fn, [], replace(SMALL_FLUSH, method="host_time"))
    assert len(timed.samples_ms) == 100 and all(ms >= 0.5 for ms in timed.samples_ms)
    assert dev.log[6:9] == ["sync", "call", "sync"]  # no event inside the window


def test_do_bench_repeats_for_its_100_ms_and_synchronises_once_after() -> None:
    dev = FakeGpu(call_ms=1.0)
    timed = time_kernelbench(dev, dev.fn, [], replace(SMALL_FLUSH, method="do_bench"))
    assert 90 <= len(timed.samples_ms) <= 100  # 100 ms over an estimate a little above 1 ms
    assert all(abs(ms - 1.0) < 0.01 for ms in timed.samples_ms)
    timed_loop = dev.log[dev.log.index("sync", 4) + 1:]  # after the estimate's synchronise: warm-up, the loop
    assert timed_loop.count("sync") == 1 + FLUSH_PROBES * 2  # once after the loop, then the flush probes


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="nsight"):
        time_kernelbench(FakeGpu(0.1), lambda: None, [], replace(SMALL_FLUSH, method="nsight"))


def test_on_a_cpu_every_method_gives_host_times() -> None:
    from kbv.sandbox.timers import Clock

    clock = Clock(torch.device("cpu"))
    x = torch.ones(8)
    for method in ("cuda_event", "host_time", "do_bench"):
        timed = time_kernelbench(clock, torch.relu, [x], StandardTimerConfig(method=method))
        assert timed.samples_ms and timed.flush_ms is None and timed.host_ms == timed.samples_ms, method
