"""Local lanes (`kbv.executors.lanes`): which lane takes which pair, a lane that fails (retried once
elsewhere, then `crashed`; retired after failures in a row), two CPU lanes against one on the smoke
pairs, resume across lane counts, and bad `--devices` values."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from scaleout import outcome
from typer.testing import CliRunner

from kbv.api import EvalConfig, evaluate
from kbv.candidates import Candidate, Pair
from kbv.cli import app
from kbv.errors import HarnessError, ProblemRunError, RunFailure
from kbv.executors import Job
from kbv.executors.lanes import RETIRE_AFTER, LanesExecutor, Waiting, pick_next
from kbv.problems import Problem
from kbv.protocols import blank_verdict
from kbv.protocols.standard import StandardProtocol
from kbv.settings import Settings
from kbv.verdict import Status, Verdict

# -- pick_next: a problem stays on its lane, and a lane takes only pairs whose build is ready ---------


def _w(problem: str, ready: bool = True, avoid: int | None = None, protocol: str = "standard") -> Waiting:
    return Waiting((protocol, problem), ready, avoid)


def _g(*problems: str) -> set[tuple[str, str]]:
    return {("standard", p) for p in problems}


def test_a_lane_takes_more_of_the_problem_it_holds() -> None:
    assert pick_next([_w("A"), _w("B"), _w("A")], 0, _g("A"), others=_g("B"), idle=False) == 0
    assert pick_next([_w("B"), _w("A")], 0, _g("A"), others=_g("B"), idle=False) == 1


def test_a_lane_without_one_takes_a_problem_no_other_lane_holds() -> None:
    assert pick_next([_w("A"), _w("A"), _w("B")], 1, set(), others=_g("A"), idle=False) == 2


def test_only_an_idle_lane_joins_a_held_problem_and_it_joins_the_longest() -> None:
    pending = [_w("A"), _w("B"), _w("B")]
    assert pick_next(pending, 2, _g("C"), others=_g("A", "B"), idle=False) is None
    assert pick_next(pending, 2, _g("C"), others=_g("A", "B"), idle=True) == 1


def test_a_retried_pair_avoids_the_lane_that_failed_it() -> None:
    assert pick_next([_w("A", avoid=0)], 0, _g("A"), others=set(), idle=True) is None
    assert pick_next([_w("A", avoid=0)], 1, set(), others=_g("A"), idle=True) == 0


def test_a_ready_pair_runs_while_an_earlier_pair_still_builds() -> None:
    assert pick_next([_w("A", ready=False), _w("A")], 0, set(), others=set(), idle=True) == 1
    assert pick_next([_w("A", ready=False), _w("B")], 0, _g("A"), others=set(), idle=False) == 1
    assert pick_next([_w("A", ready=False)], 0, _g("A"), others=set(), idle=True) is None  # nothing ready: wait


def test_a_problem_whose_pairs_are_all_ready_goes_first_and_protocols_are_apart() -> None:
    # A still has a pair building: B, all ready, is prepared once and finished first
    pending = [_w("A"), _w("A", ready=False), _w("B"), _w("B")]
    assert pick_next(pending, 0, set(), others=set(), idle=True) == 2
    # the lane holds A under the standard protocol only: a verified pair of A is a new preparation
    both = [_w("A", protocol="verified"), _w("A")]
    assert pick_next(both, 0, _g("A"), others=set(), idle=False) == 1


# -- LanesExecutor over fake lanes ------------------------------------------------------------------


class FakeRunner:
    name = "standard"

    def blank(self, pair: Pair) -> Verdict:
        return blank_verdict(pair, StandardProtocol(), {})


class FakeLane:
    """A lane answering each job on its own thread; `fails(job)` says when its evaluation raises."""

    def __init__(self, device: str, fails: Callable[[Job], bool] = lambda job: False,
                 gate: threading.Event | None = None) -> None:
        self.gate = gate or threading.Event()
        if gate is None:
            self.gate.set()
        self.settings = Settings(device=device, run_dir=Path("unused"), cache_dir=Path("unused"))
        self.runners: dict[str, Any] = {"standard": FakeRunner()}
        self.fails = fails
        self.seen: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._lock = threading.Lock()

    def submit(self, job: Job) -> Future[Verdict]:
        with self._lock:
            self.seen.append(job.key)
        return self._pool.submit(self._answer, job)

    def _answer(self, job: Job) -> Verdict:
        self.gate.wait(30)  # lanes are slower than submissions
        if job.pair.problem.name == "99_Broken":
            raise ProblemRunError("99_Broken.py: get_inputs() raised")
        if self.fails(job):
            raise RuntimeError(f"the device of {self.settings.device} is gone")
        from dataclasses import replace

        return replace(self.runners["standard"].blank(job.pair), status=Status.CORRECT)

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _jobs(*problems: str) -> list[Job]:
    jobs = []
    for i, name in enumerate(problems):
        problem = Problem(name=name, level=1, problem_id=i, code=f"# {name}\n", origin=f"{name}.py")
        cand = Candidate(code=f"# candidate {i}\n", name=f"{name}__c{i}", origin=f"c{i}.py", problem_ref=name)
        jobs.append(Job(Pair(problem, cand), "standard", f"key{i}"))
    return jobs


def _run(executor: LanesExecutor, jobs: list[Job], gate: threading.Event | None = None) -> list[Any]:
    futures = [executor.submit(job) for job in jobs]
    if gate is not None:
        gate.set()
    out = []
    for fut in futures:
        try:
            out.append(fut.result(timeout=30))
        except Exception as exc:
            out.append(exc)
    executor.close()
    return out


def test_pairs_of_a_problem_stay_on_one_lane_and_lanes_share_the_work() -> None:
    gate = threading.Event()
    lanes = [FakeLane("cpu", gate=gate), FakeLane("cpu", gate=gate)]
    verdicts = _run(LanesExecutor(lanes), _jobs("1_A", "1_A", "2_B", "2_B"), gate)
    assert all(v.status is Status.CORRECT for v in verdicts)
    assert sorted(lanes[0].seen + lanes[1].seen) == ["key0", "key1", "key2", "key3"]
    assert {frozenset(lane.seen) for lane in lanes} == {frozenset({"key0", "key1"}), frozenset({"key2", "key3"})}


def test_a_failing_lane_has_its_pair_run_again_on_another_lane() -> None:
    flaky = FakeLane("cuda:0", fails=lambda job: job.key == "key0")
    lanes = [flaky, FakeLane("cuda:1")]
    verdicts = _run(LanesExecutor(lanes), _jobs("1_A", "2_B"))
    assert [v.status for v in verdicts] == [Status.CORRECT, Status.CORRECT]
    assert "key0" in flaky.seen and "key0" in lanes[1].seen


def test_a_pair_that_fails_twice_is_crashed_with_both_reasons() -> None:
    lanes = [FakeLane("cuda:0", fails=lambda job: job.key == "key0"),
             FakeLane("cuda:1", fails=lambda job: job.key == "key0")]
    crashed, fine = _run(LanesExecutor(lanes), _jobs("1_A", "2_B"))
    assert crashed.status is Status.CRASHED and fine.status is Status.CORRECT
    assert "2 times" in crashed.message
    assert "cuda:0: RuntimeError: the device of cuda:0 is gone" in crashed.message
    assert "cuda:1: RuntimeError: the device of cuda:1 is gone" in crashed.message
    assert "Traceback" in crashed.evidence["traceback"]


def test_one_lane_retries_on_itself_and_a_problem_error_is_not_retried() -> None:
    lane = FakeLane("cpu", fails=lambda job: lane.seen.count(job.key) == 1 and job.key == "key0")
    verdict, problem_error = _run(LanesExecutor([lane]), _jobs("1_A", "99_Broken"))
    assert verdict.status is Status.CORRECT and lane.seen.count("key0") == 2
    assert isinstance(problem_error, ProblemRunError) and lane.seen.count("key1") == 1


def test_kbv_running_out_of_memory_is_the_runs_failure_never_the_candidates_crash() -> None:
    """The GPU run of 2026-12-05: a full-size ReLU ran the lane's own process out of device memory twice,
    and the pair was stored as the candidate's `crashed`. Now: a run failure, stored, tried on resume."""
    class OutOfMemoryLane(FakeLane):
        def _answer(self, job: Job) -> Verdict:
            if job.key == "key0":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.25 GiB. GPU 0 has a total "
                                             "capacity of 79.18 GiB of which 5.08 GiB is free.")
            return super()._answer(job)

    lane = OutOfMemoryLane("cuda:0")
    failure, fine = _run(LanesExecutor([lane]), _jobs("2_ReLU", "2_B"))
    assert isinstance(failure, RunFailure) and fine.status is Status.CORRECT
    assert lane.seen.count("key0") == 1  # not retried: more of the same would fail the same way
    message = str(failure)
    assert message.startswith("2_ReLU.py: kbv itself ran out of memory on cuda:0") and "not the candidate's" in message


def test_a_lane_that_keeps_failing_is_retired_and_with_no_lane_left_the_harness_raises() -> None:
    dead = FakeLane("cuda:0", fails=lambda job: True)
    verdicts = _run(LanesExecutor([dead, FakeLane("cuda:1")]), _jobs(*[f"{i}_P{i}" for i in range(1, 7)]))
    assert all(v.status is Status.CORRECT for v in verdicts)  # every pair went on on the healthy lane
    assert len(dead.seen) <= RETIRE_AFTER + 2  # retired, apart from what its window already held

    alone = FakeLane("cuda:0", fails=lambda job: True)
    outcomes = _run(LanesExecutor([alone]), _jobs(*[f"{i}_P{i}" for i in range(1, 5)]))
    assert any(isinstance(o, HarnessError) and "every evaluation lane failed" in str(o) for o in outcomes)


class FakeBuilds:
    """A build pool whose builds finish when the test says (`finish`); candidates named `*__nobuild`
    need none."""

    def __init__(self) -> None:
        self.futures: dict[str, Future[Any]] = {}

    def start(self, pair: Pair) -> Future[Any]:
        fut: Future[Any] = self.futures.setdefault(pair.candidate.name, Future())
        if pair.candidate.name.endswith("__nobuild") and not fut.done():
            fut.set_result(None)
        return fut

    def finish(self, name: str) -> None:
        self.futures[name].set_result(None)

    def state(self) -> Any:
        from kbv.builds import BuildState

        running = [n for n, f in self.futures.items() if not f.done()]
        return BuildState(running=len(running), oldest=running[0] if running else None, oldest_s=12.0)

    def progress_of(self, pair: Pair) -> str | None:
        fut = self.futures.get(pair.candidate.name)
        return None if fut is None or pair.candidate.name.endswith("__nobuild") else \
            ("done" if fut.done() else "running 12 s")

    def shutdown(self, wait: bool) -> None:
        pass


def _named_jobs(*names: str) -> list[Job]:
    jobs = []
    for i, name in enumerate(names):
        problem_name = name.split("__")[0]
        problem = Problem(name=problem_name, level=1, problem_id=int(problem_name.split("_")[0]),
                          code=f"# {problem_name}\n", origin=f"{problem_name}.py")
        cand = Candidate(code=f"# candidate {i}\n", name=name, origin=f"{name}.py", problem_ref=problem_name)
        jobs.append(Job(Pair(problem, cand), "standard", f"key{i}"))
    return jobs


def test_pairs_run_as_their_builds_finish_and_one_needing_no_build_never_waits() -> None:
    builds = FakeBuilds()
    lane = FakeLane("cpu")
    executor = LanesExecutor([lane], builds)  # type: ignore[arg-type]
    jobs = _named_jobs("1_A__slow", "1_A__quick", "2_B__nobuild")
    futures = [executor.submit(job) for job in jobs]
    assert futures[2].result(timeout=30).status is Status.CORRECT  # while both builds compile
    assert lane.seen == ["key2"] and not futures[0].done()
    state = executor.state()
    assert state.builds_running == 2 and state.next_pair == "L1/1_A/1_A__slow standard"
    assert state.next_waits_for == "its build (running 12 s)"
    builds.finish("1_A__quick")  # the later pair's build is ready first: it goes first
    futures[1].result(timeout=30)
    builds.finish("1_A__slow")
    futures[0].result(timeout=30)
    executor.close()
    assert lane.seen == ["key2", "key1", "key0"]
    assert executor.state().next_pair is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread priorities are Linux's")
def test_a_build_that_finishes_on_a_build_thread_gives_its_low_priority_to_no_lane() -> None:
    """A thread inherits its creator's priority, and a lane's threads start the children it times:
    the pair a finished build releases is handed on by a thread at the caller's priority."""
    from kbv.placement import lower_priority

    builds = FakeBuilds()
    lane = FakeLane("cpu")
    handed_at: list[int] = []
    submit = lane.submit

    def recording(job: Job) -> Future[Verdict]:
        handed_at.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return submit(job)

    lane.submit = recording  # type: ignore[method-assign]
    executor = LanesExecutor([lane], builds)  # type: ignore[arg-type]
    (job,) = _named_jobs("1_A__slow")
    future = executor.submit(job)

    def build_thread() -> None:
        lower_priority()
        builds.finish("1_A__slow")

    thread = threading.Thread(target=build_thread)
    thread.start()
    thread.join()
    future.result(timeout=30)
    executor.close()
    assert handed_at == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]


# -- real lanes on the CPU --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_cpu_lanes_give_the_verdicts_of_one_and_resume_across_lane_counts(
        one_lane: Any, smoke_candidates: Path, cache_dir: Path, tmp_path: Path) -> None:
    config = EvalConfig(candidates=str(smoke_candidates), problems="smoke", protocol="both", devices="cpu,cpu",
                        seed=7, timer_budget_s=1.0, jobs=1, run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir))
    two = evaluate(config)
    assert two.evaluated == len(one_lane.verdicts) == 8
    assert outcome(two.verdicts) == outcome(one_lane.verdicts)
    assert [(v.problem, v.candidate, v.protocol) for v in two.verdicts] == \
        [(v.problem, v.candidate, v.protocol) for v in one_lane.verdicts]  # problem order, not completion order
    again = evaluate(EvalConfig(**{**config.__dict__, "devices": None, "device": "cpu"}))
    assert (again.evaluated, again.resumed) == (0, 8)
    assert outcome(again.verdicts) == outcome(one_lane.verdicts)


# -- bad --devices ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "says"), [
    (("--devices", "0,0"), "--devices '0,0'"),
    (("--devices", "x"), "--devices 'x'"),
    (("--devices", "cpu,0"), "no mixing"),
    (("--devices", "1,,2"), "--devices '1,,2'"),
    (("--devices", "99"), "no GPU 99 here"),
    (("--devices", "cpu,cpu", "--device", "cpu"), "Give --device or --devices, not both."),
    (("--devices", "cpu,cpu", "--executor", "ray"), "--devices is for the local executor"),
    (("--ray-address", "auto"), "--ray-address needs --executor ray"),
    (("--executor", "dask"), "Unknown executor 'dask'"),
])
def test_bad_devices_and_executor_options_are_one_line_errors(options: tuple[str, ...], says: str,
                                                              smoke_candidates: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(smoke_candidates), "--problems", "smoke",
                                      "--run", str(tmp_path / "run"), *options])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], result.stderr


# -- several pairs on one device ------------------------------------------------------------------


@pytest.mark.slow
def test_two_pairs_on_one_device_overlap_their_untimed_work_and_never_a_timed_window(
        one_lane: Any, smoke_candidates: Path, cache_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--pairs-per-device 2` on one CPU: the same verdicts as one lane, and every command that one
    lane sends to a device (its children's, its baselines', a child coming up) lies outside every timed
    window (timing, memory, probes) of the other, while the two lanes' untimed commands do run at the
    same time."""
    import kbv.sandbox.parent as parent
    from kbv.placement import Quiet
    from kbv.sandbox.parent import Sandbox

    windows: list[tuple[int, float, float]] = []  # (thread, start, end) of each exclusive window
    commands: list[tuple[int, float, float, str]] = []  # (thread, start, end, op) of each command sent
    enter, leave, call = Quiet.__enter__, Quiet.__exit__, Sandbox.call
    opened: dict[int, float] = {}

    def entered(self: Quiet) -> Quiet:
        out = enter(self)
        if self._depth == 1:
            opened[threading.get_ident()] = time.monotonic()
        return out

    def left(self: Quiet, *exc: object) -> None:
        if self._depth == 1:
            windows.append((threading.get_ident(), opened.pop(threading.get_ident()), time.monotonic()))
        leave(self, *exc)

    sent = threading.local()  # when the command left: a call first lets a waiting window in (`kbv.gate`)
    send = parent.send_command

    def sending(*args: Any, **kwargs: Any) -> Any:
        sent.at = time.monotonic()
        return send(*args, **kwargs)

    def timed_call(self: Sandbox, command: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        # a child answers `ping` once it has imported torch, before any device comes up: CPU work,
        # kept off the lanes' cores (or stopped in a window, in hold mode) by the build isolation
        if command.get("op") == "ping":
            return call(self, command, *args, **kwargs)
        sent.at = None
        try:
            return call(self, command, *args, **kwargs)
        finally:
            if sent.at is not None:
                commands.append((threading.get_ident(), sent.at, time.monotonic(),
                                 f"{threading.current_thread().name}: {command.get('op')}"))

    monkeypatch.setattr(Quiet, "__enter__", entered)
    monkeypatch.setattr(Quiet, "__exit__", left)
    monkeypatch.setattr(Sandbox, "call", timed_call)
    monkeypatch.setattr(parent, "send_command", sending)
    config = EvalConfig(candidates=str(smoke_candidates), problems="smoke", protocol="both", device="cpu",
                        pairs_per_device=2, seed=7, timer_budget_s=1.0, jobs=1, run_dir=str(tmp_path / "run"),
                        cache_dir=str(cache_dir))
    two = evaluate(config)
    assert two.evaluated == 8 and outcome(two.verdicts) == outcome(one_lane.verdicts)
    assert windows and len({t for t, _, _, _ in commands}) >= 2
    for owner, w0, w1 in windows:
        intruders = [c for c in commands if c[0] != owner and c[1] < w1 and w0 < c[2]]
        assert not intruders, f"a command of another lane ran inside a timed window: {intruders[:3]}"
    untimed = [c for c in commands if not any(c[0] == o and w0 <= c[1] and c[2] <= w1 for o, w0, w1 in windows)]
    overlapped = any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in untimed for b in untimed)
    assert overlapped, "the two lanes' untimed work never ran at the same time"


@pytest.mark.slow
def test_later_problems_time_their_baseline_in_a_child_started_ahead(
        one_lane: Any, smoke_candidates: Path, cache_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A problem's baseline child is a spare the lane started while earlier pairs ran (up and ready when
    the preparation asks), not one spawned then; the verdicts are those of a lane that keeps none."""
    import kbv.protocols.standard as standard

    took = standard.reference_child
    ready_when_taken: list[bool] = []

    def reference_child(*args: Any, **kwargs: Any) -> Any:
        sb = took(*args, **kwargs)
        ready_when_taken.append(sb.channel is not None)  # `Sandbox.ready` has run: its device is up
        return sb

    monkeypatch.setattr(standard, "reference_child", reference_child)
    result = evaluate(EvalConfig(candidates=str(smoke_candidates), problems="smoke", protocol="standard",
                                 device="cpu", seed=7, timer_budget_s=1.0, jobs=1, run_dir=str(tmp_path / "run"),
                                 cache_dir=str(cache_dir)))
    assert len(ready_when_taken) == 3 and any(ready_when_taken[1:]), ready_when_taken  # one a problem
    assert outcome(result.verdicts) == outcome([v for v in one_lane.verdicts if v.protocol == "standard"])
