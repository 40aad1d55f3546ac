"""Where builds and starting children run (`kbv.placement`): the plan for a machine, threads and the
processes they start landing on their cores at their priority, a started child moved whole onto its
lane's cores, and builds held while a pair is timed (and their clock with them)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kbv.placement import (
    BUILD_NICE,
    Bystanders,
    CorePlan,
    Holds,
    Isolation,
    Quiet,
    enter_build_thread,
    move_process,
    plan_cores,
    thread_cpus,
)
from kbv.sandbox import ChildSpec, Sandbox

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity is Linux's")


# -- the plan ---------------------------------------------------------------------------------------

def test_a_gpu_lane_keeps_two_cpus_and_builds_get_the_rest() -> None:
    plan = plan_cores(Isolation.AUTO, 1, "cuda", range(16))
    assert plan.mode is Isolation.PIN and plan.lanes == (frozenset({14, 15}),)
    assert plan.builds == frozenset(range(14)) and plan.build_cpus == 14


def test_a_lane_takes_whole_cores_so_no_build_shares_one_with_a_timed_child() -> None:
    siblings = {cpu: frozenset({cpu % 8, cpu % 8 + 8}) for cpu in range(16)}  # 8 cores, 2 threads each
    plan = plan_cores(Isolation.AUTO, 1, "cuda", range(16), siblings)
    assert plan.lanes == (frozenset({7, 15}),)
    assert not any(siblings[cpu] & plan.lanes[0] for cpu in plan.builds)


def test_a_lanes_children_share_one_cpu_and_its_own_thread_keeps_the_other() -> None:
    """The candidate and its baselines time on the same CPU: two children on two CPUs stay apart
    (the scheduler wakes each where it last ran), and one CPU can be quicker than the other."""
    plan = plan_cores(Isolation.AUTO, 1, "cuda", range(16))
    assert plan.child_cpus(0) == {14} and plan.driver_cpus(0) == {15}
    one = plan_cores(Isolation.AUTO, 8, "cuda", range(16))  # a lane of one CPU shares it
    assert one.child_cpus(3) == one.driver_cpus(3) == one.lane_cpus(3)


def test_lanes_get_cores_of_their_own_and_fewer_where_the_machine_is_small() -> None:
    two = plan_cores(Isolation.AUTO, 2, "cuda", range(16))
    assert two.lanes == (frozenset({14, 15}), frozenset({12, 13})) and len(two.builds) == 12
    eight = plan_cores(Isolation.AUTO, 8, "cuda", range(16))  # 2 each would leave builds no half
    assert [len(c) for c in eight.lanes] == [1] * 8 and len(eight.builds) == 8


def test_auto_holds_where_nothing_can_be_set_apart_and_on_the_cpu_device() -> None:
    assert plan_cores(Isolation.AUTO, 1, "cpu", range(16)).mode is Isolation.HOLD
    assert plan_cores(Isolation.AUTO, 1, "cuda", [0]).mode is Isolation.HOLD
    assert plan_cores(Isolation.AUTO, 4, "cuda", range(4)).mode is Isolation.HOLD
    assert plan_cores(Isolation.NONE, 1, "cuda", range(16)) == CorePlan(Isolation.NONE, (), frozenset(), 16)
    pinned = plan_cores(Isolation.PIN, 1, "cpu", range(2))  # asked for: one CPU each
    assert pinned.mode is Isolation.PIN and pinned.lanes == (frozenset({1}),) and pinned.builds == {0}


# -- threads and the processes they start ------------------------------------------------------------

def _priority_and_cpus(pid: int) -> tuple[int, frozenset[int]]:
    return os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid))


@linux
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_build_thread_and_what_it_starts_run_on_the_build_cpus_at_the_lowest_priority() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    plan = CorePlan(Isolation.PIN, (frozenset(cpus[-1:]),), frozenset(cpus[:-1]), len(cpus))
    seen: dict[str, object] = {}

    def build() -> None:
        enter_build_thread(plan)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        try:
            seen["child"] = _priority_and_cpus(proc.pid)
        finally:
            proc.kill()
            proc.wait()

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    assert seen["child"] == (BUILD_NICE, plan.builds)
    assert frozenset(os.sched_getaffinity(0)) == frozenset(cpus)  # the calling thread is untouched


@linux
def test_a_started_child_moves_whole_onto_its_lane(tmp_path: Path) -> None:
    lane = frozenset(sorted(os.sched_getaffinity(0))[-1:])
    code = "import threading, time\n[threading.Thread(target=time.sleep, args=(5,)).start() for _ in range(3)]\ntime.sleep(5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(thread_cpus(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        move_process(proc.pid, lane)
        assert thread_cpus(proc.pid) == [lane] * 4
    finally:
        proc.kill()
        proc.wait()


def _python_threads(pid: int) -> list[frozenset[int]]:
    """The CPUs of every thread, whatever its name, of the processes at and below `pid` but a
    sandbox's bwrap (a thread's process is its Tgid; a process's name is its main thread's)."""
    from kbv.placement import _tree_threads

    out = []
    for tid in _tree_threads(pid):
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(f"/proc/{tid}/status").read_text().splitlines()
            tgid = int(next(line for line in status if line.startswith("Tgid:")).split()[1])
            if Path(f"/proc/{tgid}/comm").read_text().strip() != "bwrap":
                out.append(frozenset(os.sched_getaffinity(tid)))
    return out


@linux
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_child_runs_on_its_lanes_cpu_once_started_in_the_sandbox_too(tmp_path: Path) -> None:
    """In bwrap the child is bwrap's child: moving the process the parent started moves bwrap alone.
    The child moves itself as its device comes up (`hello`), and `move_process` moves the tree."""
    cpus = sorted(os.sched_getaffinity(0))
    mine, other = frozenset(cpus[-1:]), frozenset(cpus[:1])
    spec = ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu", cpus=tuple(mine))
    with Sandbox(spec) as sb:
        assert sb.proc is not None
        assert sb.ready(120.0)["cpus"] == sorted(mine)
        assert _python_threads(sb.proc.pid) and set(_python_threads(sb.proc.pid)) == {mine}
        move_process(sb.proc.pid, other)
        assert set(thread_cpus(sb.proc.pid)) == {other} and set(_python_threads(sb.proc.pid)) == {other}
    if os.environ.get("KBV_REQUIRE_SANDBOX"):
        assert sb.isolation.full, sb.isolation.describe()


# -- holds ------------------------------------------------------------------------------------------

def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_state(pid: int, wanted: str, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while _state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
    return _state(pid)


@linux
def test_a_held_build_stops_inside_a_timed_window_and_goes_on_after_it() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    holds = Holds(active=True)
    try:
        holds.add(spin.pid)
        with Quiet(holds=holds):
            assert _wait_state(spin.pid, "T") == "T"
            used = _cpu_s(spin.pid)
            time.sleep(0.3)
            assert _cpu_s(spin.pid) - used < 0.05  # no CPU at all while a pair is timed
        assert _wait_state(spin.pid, "R") == "R"
        assert holds.paused_s() >= 0.3
        late = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        try:
            with holds.window():
                holds.add(late.pid)  # a build that starts during a window is stopped at once
                assert _wait_state(late.pid, "T") == "T"
                holds.discard(late.pid)  # and one that leaves it goes on
                assert _wait_state(late.pid, "R") == "R"
        finally:
            late.kill()
            late.wait()
    finally:
        spin.kill()
        spin.wait()


@linux
def test_another_lanes_candidate_child_stops_in_a_window_and_its_own_lane_s_does_not() -> None:
    """Two lanes on one device: while lane 0's window is open, lane 1's candidate child (which could
    leave a thread launching work between its commands) is stopped; lane 0's own, being timed, is not."""
    own = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    bystanders = Bystanders()
    try:
        bystanders.add(0, own.pid)
        bystanders.add(1, other.pid)
        with Quiet(bystanders=bystanders, lane=0):
            assert _wait_state(other.pid, "T") == "T"
            assert _wait_state(own.pid, "R") == "R"
        assert _wait_state(other.pid, "R") == "R"
        bystanders.discard(1, other.pid)
        with Quiet(bystanders=bystanders, lane=0):  # closed: no longer stopped
            time.sleep(0.1)
            assert _state(other.pid) == "R"
    finally:
        for p in (own, other):
            p.kill()
            p.wait()


@linux
def test_a_candidate_child_stands_stopped_while_its_baseline_is_timed() -> None:
    """The standard protocol times the baseline right beside the candidate: the candidate's child,
    which has run candidate code, is stopped meanwhile (a thread it left must not load the machine)."""
    from kbv.placement import group_stopped

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        with pytest.raises(RuntimeError):
            with group_stopped(spin.pid):
                assert _wait_state(spin.pid, "T") == "T"
                raise RuntimeError("the baseline's timing failed")
        assert _wait_state(spin.pid, "R") == "R"  # going on however the block ended
        with group_stopped(None):  # no child: nothing stopped
            assert _state(spin.pid) == "R"
    finally:
        spin.kill()
        spin.wait()


def test_holds_that_are_off_touch_nothing() -> None:
    holds = Holds(active=False)
    holds.add(1)  # pid 1: would be an error to signal
    with Quiet(holds=holds):
        pass
    assert holds.paused_s() == 0.0


@linux
def test_time_held_does_not_count_against_a_childs_timeout(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    candidate = tmp_path / "build" / "cand.py"  # 1 CPU-second of import: a build that takes 1 s running
    candidate.write_text("import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n")
    spec = ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu")
    holds = Holds(active=True)
    with Sandbox(spec) as sb:
        assert sb.proc is not None
        sb.ready(120.0)  # the child's own start is not what is timed here
        holds.add(sb.proc.pid)

        def hold_for(seconds: float) -> None:
            with holds.window():
                time.sleep(seconds)

        holder = threading.Thread(target=hold_for, args=(4.0,))
        holder.start()
        t0 = time.monotonic()
        reply = sb.call({"op": "build", "path": str(candidate)}, 3.0, paused=holds.paused_s)
        holder.join()
        assert reply["built"] is True and time.monotonic() - t0 > 4.0  # past its timeout, held
        assert sb.cpu_seconds() is not None and sb.cpu_seconds() >= 1.0


# -- end to end -----------------------------------------------------------------------------------

WHERE = '''\
import json, os
with open(PATH, "a") as f:
    f.write(json.dumps({"who": WHO, "cwd": os.getcwd(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                        "cpus": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS")}) + "\\n")
'''

RECORDS = '''\
# cpp_sources = (none: "built" by importing it; it records where each child that imports it runs)
import torch
import torch.nn as nn
''' + WHERE.replace("WHO", repr("candidate")) + '''


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


@linux
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pinned_builds_and_timed_children_run_where_the_plan_says(tmp_path: Path, monkeypatch) -> None:
    """The candidate's children and the reference children its baselines are made in, spawned by
    the protocol (no spare ready: `SPARES` = 0), all where the lane's children go."""
    import json

    import kbv.executors.local as local
    from kbv.api import EvalConfig, evaluate
    from kbv.placement import current_plan
    from sources import RELU_PROBLEM, write_tree

    monkeypatch.setattr(local, "SPARES", 0)
    log = tmp_path / "where.jsonl"
    where = WHERE.replace("PATH", repr(str(log)))
    write_tree(tmp_path / "problems", {"level1/19_ReLU.py": where.replace("WHO", repr("problem")) + RELU_PROBLEM})
    write_tree(tmp_path / "cands", {"19_ReLU__where.py": RECORDS.replace("PATH", repr(str(log)))})
    plan = current_plan("pin", 1, "cpu")
    result = evaluate(EvalConfig(candidates=str(tmp_path / "cands"), problems=str(tmp_path / "problems"),
                                 device="cpu", build_isolation="pin", run_dir=str(tmp_path / "run"),
                                 cache_dir=str(tmp_path / "cache"), seed=1,
                                 sandbox="off"))  # the candidate reports to a file of the test's
    assert [v.status.value for v in result.verdicts] == ["correct"], result.verdicts[0].message
    assert result.verdicts[0].provenance["build_isolation"] == plan.describe()
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    children = [s for s in seen if str(tmp_path / "run") in s["cwd"]]  # not this process's imports
    builds = [s for s in children if "/build-" in s["cwd"]]
    timed = [s for s in children if "/build-" not in s["cwd"]]
    assert builds and {s["who"] for s in timed} == {"candidate", "problem"}
    assert all(s["nice"] == BUILD_NICE and frozenset(s["cpus"]) == plan.builds for s in builds)
    child = plan.child_cpus(0)
    assert all(s["nice"] == 0 and frozenset(s["cpus"]) == child and s["omp"] == str(len(child)) for s in timed)
