"""One local lane (`kbv.executors.local`): the prepared problems it holds while builds finish out of
order (each prepared once while held, the least recently used released first, a second let go when
the device runs out of memory), what it says it is doing, and a candidate its device cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kbv.candidates import Backend, Candidate, Pair
from kbv.executors.local import HELD_PER_PROTOCOL, LocalExecutor, skip_unrunnable
from kbv.errors import ProblemRunError
from kbv.memory_plan import ProblemTooLarge
from kbv.problems import Problem
from kbv.settings import Settings
from kbv.verdict import Status, Verdict


class CountingRunner:
    """Prepares a problem into a token; `oom_when_held`: preparing with another held runs out of memory;
    `room`: with that many problems held it is refused as too large for the memory available (`live`
    may be another runner's: one device)."""

    name = "standard"

    def __init__(self, oom_when_held: bool = False, room: int = 0) -> None:
        self.prepared: list[str] = []
        self.released: list[str] = []
        self.live: set[str] = set()
        self.oom_when_held = oom_when_held
        self.room = room
        self.refusals = 0

    def prepare(self, pair: Pair) -> str:
        if self.oom_when_held and self.live:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.room and len(self.live) >= self.room:
            self.refusals += 1
            raise ProblemTooLarge(f"{pair.problem.name}: too large for this machine under the verified protocol")
        self.prepared.append(pair.problem.name)
        self.live.add(pair.problem.name)
        return pair.problem.name

    def release(self, context: str) -> None:
        self.released.append(context)
        self.live.discard(context)


def _pair(name: str) -> Pair:
    problem = Problem(name=name, level=1, problem_id=int(name.split("_")[0]), code=f"# {name}\n", origin=f"{name}.py")
    return Pair(problem, Candidate(code="# c\n", name=f"{name}__c", origin="c.py", problem_ref=name))


def _judged_verdict(protocol: str) -> Verdict:
    return Verdict("L1/9_A", "h", 1, "9_A__c", "c", protocol, "1", Status.CORRECT)


def _lane(tmp_path: Path, runner: CountingRunner) -> Any:
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    return LocalExecutor(settings, {"standard": runner})  # type: ignore[dict-item]


def test_a_lane_prepares_each_problem_once_while_it_holds_it(tmp_path: Path) -> None:
    runner = CountingRunner()
    lane = _lane(tmp_path, runner)
    assert HELD_PER_PROTOCOL == 2
    for name in ("1_A", "2_B", "1_A", "2_B", "1_A"):  # builds of A and B finishing in turns
        assert lane._context(runner, _pair(name)) == name
    assert runner.prepared == ["1_A", "2_B"] and runner.released == []
    lane._context(runner, _pair("3_C"))  # a third: the least recently used (B) goes
    assert runner.released == ["2_B"] and runner.live == {"1_A", "3_C"}
    lane._context(runner, _pair("2_B"))
    assert runner.prepared == ["1_A", "2_B", "3_C", "2_B"] and runner.released == ["2_B", "1_A"]
    lane.close()
    assert runner.live == set()  # what it held is released with it


def test_out_of_device_memory_with_another_problem_held_releases_it_and_prepares_again(tmp_path: Path) -> None:
    runner = CountingRunner(oom_when_held=True)
    lane = _lane(tmp_path, runner)
    lane._context(runner, _pair("1_A"))
    assert lane._context(runner, _pair("2_B")) == "2_B"  # not a problem failure: A made room
    assert runner.released == ["1_A"] and runner.live == {"2_B"}
    lane.close()


def test_a_problem_refused_beside_its_own_standard_trials_is_prepared_once_they_are_released(tmp_path: Path) -> None:
    """On an 80 GB GPU, KernelBench's L1/9 (4 GiB outputs) was refused under verified, 43 GiB free:
    standard's five trials of the same problem, judged just before, still held the rest. Other problems
    go first; then the same problem's standard trials, which standard prepares again if it must."""
    for room, released in ((1, ["2_B", "9_A"]), (2, ["2_B"])):  # the same problem's trials go only if they must
        standard = CountingRunner()
        verified = CountingRunner(room=room)
        verified.name, verified.live = "verified", standard.live  # one device
        settings = Settings(device="cpu", run_dir=tmp_path / f"run{room}", cache_dir=tmp_path / "cache")
        lane = LocalExecutor(settings, {"standard": standard, "verified": verified})  # type: ignore[dict-item]
        lane._context(standard, _pair("2_B"))
        lane._context(standard, _pair("9_A"))
        assert lane._context(verified, _pair("9_A")) == "9_A"  # prepared, not a problem failure
        assert standard.released == released and verified.prepared == ["9_A"], room
        assert lane._context(standard, _pair("9_A")) == "9_A"
        assert standard.prepared == ["2_B", "9_A"] + ["9_A"] * (room == 1)  # prepared again where it was let go
        lane.close()


def test_a_refusal_with_nothing_held_but_failures_is_not_prepared_again(tmp_path: Path) -> None:
    """A stored failure holds no memory: releasing it makes no room, so no preparation is repeated."""
    runner = CountingRunner(room=1)
    runner.live.add("something outside the lane")  # the device is short whatever the lane lets go
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    lane = LocalExecutor(settings, {"standard": runner})  # type: ignore[dict-item]
    for name in ("1_A", "2_B"):
        try:
            lane._context(runner, _pair(name))
        except ProblemTooLarge:
            pass
    assert runner.refusals == 2 and runner.prepared == []  # once each: 1_A's stored failure made no retry for 2_B
    lane.close()


def test_no_room_for_kbvs_own_buffer_releases_what_the_lane_holds_and_judges_once_more(tmp_path: Path) -> None:
    """On an H100, KernelBench's L1/11 identity came out `cuda_error`: the buffer kbv makes for the
    outputs found no room while the same problem's standard trials held the device. The lane lets go of
    everything it holds, the pair's own preparation too (the child killed to measure it may be one of
    its baseline children), and judges the pair again; still no room, it is the run's failure (no
    verdict), never the candidate's."""
    from kbv.errors import DeviceRoomFailure
    from kbv.executors import Job

    standard, verified = CountingRunner(), CountingRunner()
    verified.name = "verified"
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    lane = LocalExecutor(settings, {"standard": standard, "verified": verified})  # type: ignore[dict-item]
    for runner, name in ((standard, "2_B"), (standard, "11_A"), (verified, "11_A")):
        lane._context(runner, _pair(name))
    calls: list[str] = []

    def evaluate_pair(job: Any, build_future: Any, clock: Any) -> str:
        calls.append(job.protocol)
        if len(calls) == 1 or "again" in job.key:
            raise DeviceRoomFailure("the device had no room for the 1.00 GiB buffer kbv makes in the candidate's child")
        return _judged_verdict(job.protocol)

    lane._evaluate_pair = evaluate_pair
    job = Job(_pair("11_A"), "verified", "k")
    v = lane._judged(job, None, None)  # type: ignore[arg-type]
    assert v.status is Status.CORRECT and calls == ["verified", "verified"]
    assert v.evidence["retried"].endswith("the device had no room for the 1.00 GiB buffer kbv makes in the candidate's child")
    assert sorted(standard.released) == ["11_A", "2_B"] and verified.released == ["11_A"]  # its own too
    again = Job(_pair("11_A"), "verified", "again")
    try:
        lane._judged(again, None, None)  # type: ignore[arg-type]
        raise AssertionError("no DeviceRoomFailure")
    except DeviceRoomFailure:
        pass
    assert calls == ["verified"] * 4  # tried once more, then the run's failure
    lane.close()


def test_kbv_out_of_device_memory_beside_other_held_problems_lets_go_of_them_and_judges_the_pair_once_more(
        tmp_path: Path) -> None:
    """On an H100, KernelBench's L1/9 identity was a failure of the run under verified: kbv's own 8 GiB
    float64 buffer found no room beside the same problem's standard trials and the problems held before
    it, though the problem alone is judged. The lane lets go of every problem it holds and judges the
    pair again, once; with nothing but the pair's own problem held, it is the run's failure at once
    (freeing nothing would leave the same room)."""
    from kbv.executors import Job

    standard, verified = CountingRunner(), CountingRunner()
    verified.name = "verified"
    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    lane = LocalExecutor(settings, {"standard": standard, "verified": verified})  # type: ignore[dict-item]
    for runner, name in ((standard, "8_B"), (standard, "9_A"), (verified, "8_B"), (verified, "9_A")):
        lane._context(runner, _pair(name))
    calls: list[str] = []
    oom = "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.18 GiB"

    def evaluate_pair(job: Any, build_future: Any, clock: Any) -> str:
        calls.append(job.key)
        if len(calls) == 1 or job.key == "alone":
            raise RuntimeError(oom)
        if job.key == "wrong":
            raise ValueError("a bug of kbv's, not memory")
        return _judged_verdict(job.protocol)

    lane._evaluate_pair = evaluate_pair
    v = lane._judged(Job(_pair("9_A"), "verified", "k"), None, None)  # type: ignore[arg-type]
    assert v.status is Status.CORRECT and calls == ["k", "k"] and "Tried to allocate 8.00 GiB" in v.evidence["retried"]
    assert sorted(standard.released) == ["8_B", "9_A"] and sorted(verified.released) == ["8_B", "9_A"]
    lane._context(verified, _pair("9_A"))  # the pair's own problem alone, prepared again
    with pytest.raises(RuntimeError, match="out of memory"):
        lane._judged(Job(_pair("9_A"), "verified", "alone"), None, None)  # type: ignore[arg-type]
    assert calls == ["k", "k", "alone"]  # not tried again: nothing else to let go of
    # a problem whose preparation ran out of memory is stored as its failure: raised again as it is,
    # with no second preparation, and nothing the lane holds is let go for it
    nine = _pair("9_A").problem.hash
    lane._contexts["verified"][nine] = ProblemRunError("9_A.py: too large for cuda:0 under the verified protocol: "
                                                       "CUDA out of memory. Tried to allocate 40.00 GiB")

    def from_context(job: Any, build_future: Any, clock: Any) -> Verdict:
        calls.append(job.key)
        lane._context(verified, job.pair)
        return _judged_verdict(job.protocol)

    lane._evaluate_pair = from_context
    lane._context(standard, _pair("8_B"))
    with pytest.raises(ProblemRunError, match="out of memory"):
        lane._judged(Job(_pair("9_A"), "verified", "stored"), None, None)  # type: ignore[arg-type]
    assert calls[-1] == "stored" and calls.count("stored") == 1 and standard.live == {"8_B"}
    assert isinstance(lane._contexts["verified"][nine], ProblemRunError)  # the record stays
    lane._evaluate_pair = evaluate_pair
    with pytest.raises(ValueError):
        lane._judged(Job(_pair("9_A"), "verified", "wrong"), None, None)  # type: ignore[arg-type]
    assert calls[-1] == "wrong" and standard.live == {"8_B"}  # any other error: nothing let go, no retry
    lane.close()


def test_an_idle_lane_says_nothing_is_evaluating(tmp_path: Path) -> None:
    lane = _lane(tmp_path, CountingRunner())
    state = lane.state()
    lane.close()
    assert state.evaluating == () and state.builds_running == 0


def test_a_gpu_short_of_free_memory_keeps_only_the_problem_in_hand(tmp_path: Path, monkeypatch: Any) -> None:
    import torch

    free = {"bytes": 90}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 100))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    runner = CountingRunner()
    settings = Settings(device="cuda:0", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    lane = LocalExecutor(settings, {"standard": runner})  # type: ignore[dict-item]
    lane._context(runner, _pair("1_A"))
    lane._context(runner, _pair("2_B"))
    assert runner.live == {"1_A", "2_B"}  # room enough: both held
    free["bytes"] = 10
    lane._context(runner, _pair("2_B"))
    assert runner.live == {"2_B"} and runner.released == ["1_A"]
    lane.close()


def test_a_problem_whose_plan_needs_more_than_is_free_has_the_device_to_itself(tmp_path: Path, monkeypatch: Any) -> None:
    """A quarter of the device free is room enough beside a small problem, not beside one whose memory
    plan holds more than that at its peak (KernelBench's L1/9: a 40 GiB plan, kbv out of memory beside
    the problems the lane held)."""
    import torch
    from types import SimpleNamespace

    class PlannedRunner(CountingRunner):
        def __init__(self, needs: dict[str, int]) -> None:
            super().__init__()
            self.needs = needs

        def prepare(self, pair: Pair) -> Any:
            name = super().prepare(pair)
            return SimpleNamespace(name=name, plan=SimpleNamespace(need=SimpleNamespace(device=self.needs[name])))

        def release(self, context: Any) -> None:
            super().release(context.name)

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40, 100))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    runner = PlannedRunner({"1_A": 10, "2_B": 30, "9_C": 70})
    settings = Settings(device="cuda:0", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    lane = LocalExecutor(settings, {"standard": runner}, held=3)  # type: ignore[dict-item]
    lane._context(runner, _pair("1_A"))
    lane._context(runner, _pair("2_B"))
    assert runner.live == {"1_A", "2_B"}  # 40% free: room for a plan of 30
    lane._context(runner, _pair("9_C"))
    assert runner.live == {"9_C"} and sorted(runner.released) == ["1_A", "2_B"]  # not for one of 70
    lane.close()


# -- a backend the device cannot run ------------------------------------------------------------

CUDA_HOME_ERROR = ("OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root. "
                   "(during import)")


def _failed(status: Status = Status.COMPILE_ERROR, protocol: str = "standard") -> Verdict:
    return Verdict("L1/19_ReLU", "h", 1, "19_ReLU__cuda", "c", protocol, "1", status, message=CUDA_HOME_ERROR,
                   evidence={"traceback": "Traceback (most recent call last):\n  ...\n" + CUDA_HOME_ERROR})


def test_a_cuda_candidate_that_fails_on_cpu_is_skipped_with_one_short_line() -> None:
    for protocol in ("standard", "verified"):
        v = skip_unrunnable(_failed(protocol=protocol), Backend.CUDA, "cpu")
        assert v.status is Status.SKIPPED and v.categories == ()
        assert v.message == "a cuda candidate cannot run on cpu (no CUDA device)"  # the same under both protocols
        assert v.evidence["skipped_failure"] == {"status": "compile_error", "message": CUDA_HOME_ERROR}
        assert v.evidence["traceback"].startswith("Traceback")  # the detail stays in the evidence


def test_a_cpu_extension_on_a_gpu_says_why_and_runnable_ones_keep_their_verdict() -> None:
    v = skip_unrunnable(_failed(Status.RUNTIME_ERROR), Backend.CPP, "cuda:1")
    assert (v.status, v.message) == (Status.SKIPPED,
                                     "a cpp candidate cannot run on cuda:1 (a C++ extension without CUDA runs on the CPU only)")
    assert skip_unrunnable(_failed(), Backend.TRITON, "cpu") == _failed()  # it could run here: its failure counts
    assert skip_unrunnable(_failed(), Backend.CUDA, "cuda:0") == _failed()
    ran = _failed(Status.CORRECT)  # a CUDA candidate that fell back to PyTorch and ran keeps its verdict
    assert skip_unrunnable(ran, Backend.CUDA, "cpu") == ran
