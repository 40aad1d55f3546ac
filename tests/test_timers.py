"""The timed window's arithmetic (kbv.sandbox.timers): a call is what its own stream did, unless other
streams kept the device busy past it; then the device-wide synchronise's own cost is taken out."""

from __future__ import annotations

from dataclasses import dataclass

from kbv.sandbox.timers import SyncCost, _call_ms


@dataclass
class Stamp:
    ms: float  # when the device reached the event


class EventClock:
    """Stands for the child's Clock: elapsed_time between two stamped events."""

    @staticmethod
    def elapsed_time(a: Stamp, b: Stamp) -> float:
        return b.ms - a.ms


COST = SyncCost(typical=0.015, high=0.030)


def test_a_call_on_its_own_stream_is_timed_begin_to_end_without_the_synchronise():
    # 1.000 ms of work, then the synchronise's return and the done event 0.020 ms later
    assert _call_ms(EventClock(), Stamp(0.0), Stamp(1.0), Stamp(1.020), COST) == 1.0


def test_work_on_another_stream_past_the_end_event_counts_less_the_synchronise():
    # the call's stream ends at 0.1 ms; a side stream keeps the device busy until 0.985 ms
    ms = _call_ms(EventClock(), Stamp(0.0), Stamp(0.1), Stamp(1.0), COST)
    assert abs(ms - 0.985) < 1e-9


def test_without_a_measured_cost_the_whole_window_counts():
    assert _call_ms(EventClock(), Stamp(0.0), Stamp(1.0), Stamp(1.020), None) == 1.020
