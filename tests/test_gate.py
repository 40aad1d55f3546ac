"""The device gate (`kbv.gate`): untimed work of several pairs shares a device, a timed window has it
alone, a waiting window is never starved, and two lanes that both want one never deadlock."""

from __future__ import annotations

import threading
import time

from kbv.gate import DeviceGate, checkpoint, holding, waited_s
from kbv.settings import time_left


def _started(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_window_waits_for_the_shared_holders_and_stops_new_ones_meanwhile():
    gate = DeviceGate()
    log: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def untimed() -> None:
        with gate.shared():
            inside.set()
            release.wait(5)
            log.append("untimed done")

    def window() -> None:
        with gate.exclusive():
            log.append("window")

    def late() -> None:
        with gate.shared():
            log.append("late untimed")

    a = _started(untimed)
    inside.wait(5)
    w = _started(window)
    _until(lambda: gate._waiting == 1)
    b = _started(late)  # arrives while the window waits: it goes after the window
    time.sleep(0.1)  # (it would be in by now if it did not wait)
    assert log == []
    release.set()
    for t in (a, w, b):
        t.join(5)
    assert log == ["untimed done", "window", "late untimed"]
    assert gate.windows == 1


def test_two_lanes_that_both_want_a_window_from_inside_their_pairs_take_turns():
    """Each lane holds the gate shared through its pair and asks for a window inside it: the shared
    hold is given up while waiting, so neither waits on the other's for ever."""
    gate = DeviceGate()
    spans: list[tuple[str, float, float]] = []
    both = threading.Barrier(2)

    def lane(name: str) -> None:
        with gate.shared():
            both.wait(5)
            with gate.exclusive():
                t0 = time.monotonic()
                time.sleep(0.05)
                spans.append((name, t0, time.monotonic()))
            with gate.shared():  # nested: passes at once
                pass

    threads = [_started(lane, n) for n in ("a", "b")]
    for t in threads:
        t.join(5)
    assert sorted(n for n, _, _ in spans) == ["a", "b"]
    (_, a0, a1), (_, b0, b1) = sorted(spans, key=lambda s: s[1])
    assert a1 <= b0  # the windows never overlap


def test_a_checkpoint_lets_a_waiting_window_in_between_two_commands():
    gate = DeviceGate()
    order: list[str] = []
    first_done = threading.Event()

    def lane() -> None:
        with holding(gate):
            order.append("command 1")
            first_done.set()
            _until(lambda: gate._waiting == 1)
            checkpoint()  # the window goes now, not after the rest of this stage
            order.append("command 2")

    def window() -> None:
        with gate.exclusive():
            order.append("window")

    t = _started(lane)
    first_done.wait(5)
    w = _started(window)
    for th in (t, w):
        th.join(5)
    assert order == ["command 1", "window", "command 2"]


def test_the_seconds_a_pair_waits_at_the_gate_do_not_count_against_its_deadline():
    gate = DeviceGate()
    holding_window = threading.Event()
    seen: dict[str, float] = {}

    def window() -> None:
        with gate.exclusive():
            holding_window.set()
            time.sleep(0.3)

    w = _started(window)
    holding_window.wait(5)
    with holding(gate):  # waits for the window to close
        seen["waited"] = waited_s()
        seen["left"] = time_left(time.monotonic() + 1.0)
    w.join(5)
    assert seen["waited"] > 0.2
    assert seen["left"] > 1.15  # the deadline moved on by the wait
    assert waited_s() == 0.0  # no gate current outside a pair


def test_a_window_whose_synchronise_fails_never_opens_and_leaves_the_gate_usable():
    """A device fault at a window's start: the error reaches the lane, the gate is not left held."""
    def fault() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    gate = DeviceGate(synchronize=fault)
    with holding(gate):
        try:
            with gate.exclusive():
                raise AssertionError("the window opened")
        except RuntimeError as exc:
            assert "illegal memory access" in str(exc)
    done = threading.Event()

    def other() -> None:
        with gate.shared():
            done.set()

    _started(other).join(5)
    assert done.is_set() and gate._writer is None and not gate._shared


def test_a_window_synchronises_the_device_before_it_opens():
    calls: list[int] = []
    gate = DeviceGate(synchronize=lambda: calls.append(1))
    with gate.exclusive():
        with gate.exclusive():  # re-entrant: one window, one synchronise
            pass
    assert calls == [1]
