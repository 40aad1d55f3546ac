"""The memory the lanes' pairs in flight claim (`kbv.room`): a plan counts only what the other lanes have not
claimed, a problem that does not fit beside them waits to have the memory to itself rather than being
refused, and no wait keeps another lane from its timed windows."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kbv.memory_plan as memory_plan
import kbv.room as room_module
from kbv.gate import DeviceGate, holding, waited_s
from kbv.memory_plan import FIT_SHARE, Need, available_memory, claim_plan
from kbv.room import HOST, Room, alone, sharing, using

GIB = 1 << 30


def _started(target: Any) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_plan_counts_only_what_the_other_lanes_pairs_have_not_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_plan, "host_available_bytes", lambda: 10 * GIB)
    room = Room()
    with using(room, "a", "cpu"):
        claim_plan(Need(0, 6 * GIB))
        assert available_memory("cpu").host_bytes == 10 * GIB  # its own claim is not taken from it
        seen: list[int] = []

        def other_lane() -> None:
            with using(room, "b", "cpu"):
                seen.append(available_memory("cpu").host_bytes)
                assert sharing()

        _started(other_lane).join(5)
        assert seen == [4 * GIB]
    assert room.claimed("a") == {} and room.peak == {HOST: 6 * GIB}  # a pair's claim ends with it
    assert available_memory("cpu").host_bytes == 10 * GIB  # no room current: what is free


def test_a_lane_that_waits_to_be_alone_waits_for_the_others_claims_and_holds_back_new_ones() -> None:
    room, log = Room(), []
    a_claimed, a_done, c_started = threading.Event(), threading.Event(), threading.Event()

    def lane_a() -> None:
        with using(room, "a", "cpu"):
            room_module.claim(0, 8 * GIB)
            a_claimed.set()
            a_done.wait(5)
            room_module.claim(0, 9 * GIB)  # replacing its claim never waits, though b is waiting for it
            log.append("a ends")

    def lane_b() -> None:
        with using(room, "b", "cpu"), alone():
            log.append("b alone")
            assert room.others("b", HOST) == 0
            c_started.wait(5)
            time.sleep(0.05)  # c, meanwhile, may not claim
            room_module.claim(0, 12 * GIB)
            log.append("b planned")

    def lane_c() -> None:
        c_started.set()
        with using(room, "c", "cpu"):
            room_module.claim(0, 1 * GIB)
            log.append("c claimed")

    a = _started(lane_a)
    a_claimed.wait(5)
    b = _started(lane_b)
    _until(lambda: room.wanted("a"))  # a learns that b waits (its lane lets go of what it holds)
    assert not room.wanted("b")
    a_done.set()
    a.join(5)
    _until(lambda: "b alone" in log)
    c = _started(lane_c)
    for t in (b, c):
        t.join(5)
    assert log == ["a ends", "b alone", "b planned", "c claimed"]
    assert room.peak[HOST] <= 13 * GIB  # a's 9 GiB and b's 12 never claimed together (c's 1 may join b's)


def test_a_lane_waiting_for_the_memory_steps_out_of_the_gate_so_the_others_windows_go_on() -> None:
    """Lane b holds the device's gate for its pair and waits to have the memory alone; lane a, whose
    claim b waits for, needs a timed window before its pair can end. Were b to wait inside the gate,
    neither would ever go on. b's wait counts as time waited (not against its pair's deadline)."""
    gate, room, log = DeviceGate(), Room(), []
    a_claimed, b_waiting = threading.Event(), threading.Event()

    def lane_a() -> None:
        with holding(gate), using(room, "a", "cuda:0"):
            room_module.claim(4 * GIB, 0)
            a_claimed.set()
            b_waiting.wait(5)
            time.sleep(0.3)
            with gate.exclusive():
                log.append("a timed")

    def lane_b() -> None:
        with holding(gate), using(room, "b", "cuda:0"):
            b_waiting.set()
            with alone():
                log.append("b alone")
            assert waited_s() > 0.1

    a = _started(lane_a)
    a_claimed.wait(5)
    b = _started(lane_b)
    for t in (a, b):
        t.join(10)
        assert not t.is_alive(), "deadlocked"
    assert log == ["a timed", "b alone"]


def test_two_lanes_that_plan_at_once_plan_one_after_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lane reads what is free and claims what it plans; were the reading and the claim apart,
    both would read 10 GiB free and claim 6 of it."""
    monkeypatch.setattr(memory_plan, "host_available_bytes", lambda: 10 * GIB)
    room, seen, both_in, both_claimed = Room(), [], threading.Barrier(2), threading.Barrier(2)

    def lane(name: str) -> None:
        with using(room, name, "cpu"):
            both_in.wait(5)
            with room_module.planning():
                free = available_memory("cpu").host_bytes
                seen.append(free)
                time.sleep(0.05)  # the other lane is ready to plan meanwhile
                claim_plan(Need(0, min(6 * GIB, free)))
                with room_module.planning():  # planning again inside its plan passes through
                    pass
            both_claimed.wait(5)  # both claims stand before either pair ends

    threads = [_started(lambda n=n: lane(n)) for n in ("a", "b")]
    for t in threads:
        t.join(5)
    assert sorted(seen) == [4 * GIB, 10 * GIB] and room.peak[HOST] == 10 * GIB


def test_two_lanes_that_both_want_the_room_alone_have_it_in_turn() -> None:
    """Each lane, short of memory beside the other's claim, waits to have the room to itself and plans
    again inside: the first claims as it plans while the second waits its turn, never a deadlock."""
    room, log = Room(), []
    both_claimed = threading.Barrier(2)

    def lane(name: str) -> None:
        with using(room, name, "cpu"):
            room_module.claim(0, 5 * GIB)
            both_claimed.wait(5)
            with alone():
                with room_module.planning():
                    assert room.others(name, HOST) == 0
                    room_module.claim(0, 8 * GIB)
                log.append(name)

    threads = [_started(lambda n=n: lane(n)) for n in ("a", "b")]
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "deadlocked"
    assert sorted(log) == ["a", "b"] and room.peak[HOST] == 10 * GIB  # the two 5 GiB claims, never 8 beside one


@pytest.mark.slow
def test_two_lanes_never_plan_with_the_same_free_bytes_and_neither_problem_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two CPU lanes, a host whose free memory holds one of the two problems' plans at a time, not both:
    every pair is judged (the second to plan waits for the room rather than being refused), and the
    claims never add up past the free memory (each plan alone would have fitted it: planned apart,
    the two would have claimed more than there is)."""
    from kbv.api import EvalConfig, evaluate
    from kbv.footprint import problem_footprint
    from kbv.memory_plan import Available, plan_verified
    from kbv.problems import load_problems

    problems = [p for p in load_problems("smoke") if p.key in ("L1/2_ReLU", "L1/6_Softmax")]
    assert len(problems) == 2
    needs = []
    for p in problems:
        fp = problem_footprint(p)
        assert fp is not None
        needs.append(plan_verified(fp, 10, Available(None, 1 << 50), 6 << 30, p.origin, 2).need.host)
    free = int(max(needs) / FIT_SHARE * 1.05)  # either alone fits; both at once do not
    assert sum(needs) > free
    monkeypatch.setattr(memory_plan, "host_available_bytes", lambda: free)
    rooms: list[Room] = []

    class Recorded(Room):
        def __init__(self) -> None:
            super().__init__()
            rooms.append(self)

    monkeypatch.setattr(room_module, "Room", Recorded)
    cands = tmp_path / "cands"
    cands.mkdir()
    (cands / "2_ReLU__torch.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n")
    (cands / "6_Softmax__torch.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.softmax(x, dim=1)\n")
    report = evaluate(EvalConfig(candidates=str(cands), problems="smoke", protocol="verified", devices="cpu,cpu",
                                 seed=3, timer_budget_s=0.5, jobs=1, run_dir=str(tmp_path / "run")))
    assert not report.problem_failures, [f.message for f in report.problem_failures]
    assert sorted(v.problem for v in report.verdicts) == ["L1/2_ReLU", "L1/6_Softmax"]
    assert all(v.status.value != "crashed" for v in report.verdicts)
    (room,) = rooms
    assert 0 < room.peak[HOST] <= free
