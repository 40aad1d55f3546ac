"""Orchestration through `FakeExecutor` (no child, no device): jobs per pair and protocol, the store as
the single writer, resume, problem failures, and an interrupt that keeps what was stored."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate, load_report
from kbv.errors import ProblemRunError
from kbv.executors import FakeExecutor, Job
from kbv.verdict import Status, Verdict
from sources import HONEST_RELU, RELU_PROBLEM, WRONG_RELU, write_tree


def _verdict(job: Job, status: Status = Status.CORRECT, speedup: float | None = 1.5) -> Verdict:
    p, c = job.pair.problem, job.pair.candidate
    return Verdict(problem=p.key, problem_hash=p.hash, level=p.level, candidate=c.name, candidate_hash=c.hash,
                   protocol=job.protocol, protocol_version="test", status=status,
                   speedup=speedup if status.passed else None)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_tree(tmp_path / "problems", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/20_Other.py": RELU_PROBLEM})
    write_tree(tmp_path / "cands", {"19_ReLU__a.py": HONEST_RELU, "19_ReLU__b.py": WRONG_RELU,
                                    "20_Other__a.py": HONEST_RELU})
    return tmp_path


def _config(tree: Path, **kw) -> EvalConfig:
    return EvalConfig(candidates=str(tree / "cands"), problems=str(tree / "problems"), device="cpu",
                      run_dir=str(tree / "run"), cache_dir=str(tree / "cache"), seed=3, **kw)


def test_every_pair_and_protocol_is_one_job_and_one_stored_verdict(tree):
    fake = FakeExecutor(_verdict)
    result = evaluate(_config(tree, protocol="both"), executor=fake)
    assert len(fake.submitted) == 6 and {j.protocol for j in fake.submitted} == {"standard", "verified"}
    assert result.evaluated == 6 and result.resumed == 0
    stored = load_report(tree / "run").verdicts
    assert sorted((v.candidate, v.protocol) for v in stored) == sorted(
        (j.pair.candidate.name, j.protocol) for j in fake.submitted)
    # a problem's pairs are submitted together (each problem is prepared once per protocol)
    order = [j.pair.problem.name for j in fake.submitted]
    assert order == sorted(order, key=order.index) and order.count("19_ReLU") == 4


def test_a_second_run_resumes_and_submits_nothing(tree):
    evaluate(_config(tree), executor=FakeExecutor(_verdict))
    again = FakeExecutor(_verdict)
    result = evaluate(_config(tree), executor=again)
    assert again.submitted == [] and result.resumed == 3 and result.evaluated == 0
    assert len(result.verdicts) == 3


def test_a_problem_that_fails_is_reported_and_the_others_are_stored(tree):
    def answer(job: Job) -> Verdict:
        if job.pair.problem.name == "20_Other":
            raise ProblemRunError("20_Other: get_inputs raised")
        return _verdict(job)

    result = evaluate(_config(tree), executor=FakeExecutor(answer))
    assert [f.problem for f in result.problem_failures] == ["L1/20_Other"]
    assert {v.problem for v in load_report(tree / "run").verdicts} == {"L1/19_ReLU"}


class _Interrupted(FakeExecutor):
    """Answers two jobs; waiting for the third, the user presses Ctrl-C."""

    aborted = False

    def submit(self, job):
        if len(self.submitted) == 2:
            self.submitted.append(job)
            fut = Future()
            fut.set_exception(KeyboardInterrupt())
            return fut
        return super().submit(job)

    def abort(self) -> None:
        self.aborted = True


def test_an_interrupt_aborts_the_executor_keeps_what_was_stored_and_the_rerun_finishes(tree):
    fake = _Interrupted(_verdict)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_config(tree), executor=fake)
    assert fake.aborted
    stored = load_report(tree / "run").verdicts
    assert len(stored) == 2  # the two verdicts finished before the interrupt
    rest = FakeExecutor(_verdict)
    result = evaluate(_config(tree), executor=rest)
    assert result.resumed == 2 and result.evaluated == 1 and len(rest.submitted) == 1
    assert len(load_report(tree / "run").verdicts) == 3


class _Slow(FakeExecutor):
    """Answers each job after `delay_s`, on a timer; meanwhile says one build is running."""

    lanes = 1

    def __init__(self, answer, delay_s: float) -> None:
        super().__init__(answer)
        self.delay_s = delay_s

    def submit(self, job):
        import threading

        self.submitted.append(job)
        fut = Future()
        verdict = self.answer(job)
        threading.Timer(self.delay_s * len(self.submitted), fut.set_result, args=(verdict,)).start()
        return fut

    def state(self):
        from kbv.executors import RunState

        return RunState(builds_running=1, oldest_build="19_ReLU__a", oldest_build_s=12.0, builds_done=2,
                        build_cpu_s=80.0, next_pair="L1/19_ReLU/19_ReLU__a standard", next_waits_for="its build")


def test_a_waiting_run_reports_what_it_waits_on_and_sums_up_its_wall_time(tree):
    def answer(job: Job) -> Verdict:
        from dataclasses import replace

        load_s = 2.5 if job.pair.candidate.name == "19_ReLU__b" else 0.2  # a compile on the lane, say
        return replace(_verdict(job), evidence={"pair_s": 0.5, "stages_s": {"load": load_s}})

    seen = []
    result = evaluate(_config(tree), executor=_Slow(answer, 1.5), watch=lambda state, since: seen.append((state, since)))
    assert seen, "no report while the run waited"
    assert all(state.next_waits_for == "its build" for state, _ in seen)
    assert max(since for _, since in seen) >= 1.0  # seconds since the last verdict (or the start)
    stats = result.stats
    assert stats.pairs == 3 and stats.pair_s == 1.5 and stats.lanes == 1
    assert 1.2 <= stats.first_verdict_s <= stats.wall_s and stats.wall_s >= 4.0
    assert (stats.builds, stats.build_cpu_s) == (2, 80.0)
    assert stats.busy_share == pytest.approx(1.5 / stats.wall_s)
    assert stats.floor_s == max(80.0 / stats.cpus, 1.5)
    assert "first verdict" in stats.describe() and "pairs/min" in stats.describe()
    assert (stats.longest_load_s, stats.longest_load) == (2.5, "L1/19_ReLU × 19_ReLU__b, standard")
    assert stats.describe().endswith(" · longest load 2.5 s (L1/19_ReLU × 19_ReLU__b, standard)")
