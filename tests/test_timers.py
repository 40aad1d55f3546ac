"""The timed window (kbv.sandbox.timers): a call is timed from its start event to an event recorded
after the device-wide synchronise, so work on every stream counts, less the window's own costs (idle
time only: the quickest launch, the synchronise's return), and never less than what its own stream
did; the events come in that order around the call."""

from __future__ import annotations

from dataclasses import dataclass

from kbv.sandbox.timers import Window, WindowCosts, _call_ms, time_block


@dataclass
class Stamp:
    ms: float = 0.0  # when the device reached the event


class FakeDevice:
    """Stands for the child's Clock on a GPU: events stamped with a device clock that advances by what
    the host asks (launch latency, the call's work, the synchronise's return)."""

    cuda = True
    l2 = None

    def __init__(self, call_ms: float, side_ms: float = 0.0) -> None:
        self.now = 0.0
        self.call_ms, self.side_ms = call_ms, side_ms
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
        start = self.now + 0.005  # the host's launch path
        self.stream_until = start + self.call_ms
        self.busy_until = start + self.side_ms  # work on a stream the current one never waits for
        self.log.append("call")


COSTS = WindowCosts(launch=0.007, sync=0.017)


def test_a_call_on_its_own_stream_is_timed_without_the_windows_own_costs():
    dev = FakeDevice(call_ms=1.0)
    [ms] = time_block(dev, dev.fn, [[]], 0, 1, Window(None, COSTS)).device_ms
    assert abs(ms - 1.0) < 0.005


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
