"""The service's core without HTTP, on an executor the tests finish by hand: admission, coalescing,
answers from the store, the queue's limit, draining and aborting, problem failures."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from kbv.api import EvalConfig, open_session
from kbv.errors import ProblemRunError, ServiceError
from kbv.executors import Executor, Job
from kbv.problems import load_problems
from kbv.reward import reward_rule
from kbv.serve.requests import Item, Limits
from kbv.serve.service import Service, State
from kbv.verdict import Status, Verdict
from sources import HONEST_RELU, RELU_PROBLEM, WRONG_RELU, write_tree


class HandExecutor(Executor):
    """Holds every job until the test finishes it."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[Job, Future[Verdict]]] = {}
        self.submitted: list[Job] = []
        self.aborted = False

    def submit(self, job: Job) -> Future[Verdict]:
        fut: Future[Verdict] = Future()
        self.jobs[job.key] = (job, fut)
        self.submitted.append(job)
        return fut

    def finish(self, job: Job, status: Status | None = None, speedup: float = 2.0) -> Verdict:
        passing = Status.VERIFIED if job.protocol == "verified" else Status.CORRECT
        verdict = _verdict(job, status or passing, speedup)
        self.jobs.pop(job.key)[1].set_result(verdict)
        return verdict

    def fail(self, job: Job, exc: BaseException) -> None:
        self.jobs.pop(job.key)[1].set_exception(exc)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _verdict(job: Job, status: Status, speedup: float) -> Verdict:
    p, c = job.pair.problem, job.pair.candidate
    return Verdict(problem=p.key, problem_hash=p.hash, level=p.level, candidate=c.name, candidate_hash=c.hash,
                   protocol=job.protocol, protocol_version="test", status=status,
                   speedup=speedup if status.passed else None)


@pytest.fixture
def problems(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "problems", {"level1/19_ReLU.py": RELU_PROBLEM, "level1/20_Other.py": RELU_PROBLEM})


def _open(tmp_path: Path, problems: Path, executor: Executor, limits: Limits = Limits(),
          reward: str = "kernelbench-rl") -> Iterator[Service]:
    config = EvalConfig(candidates="serve", problems=str(problems), protocol="both", device="cpu",
                        run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"), seed=1)
    with open_session(config, executor) as session:
        yield Service(session, load_problems(problems), reward_rule(reward), limits)


@pytest.fixture
def hand() -> HandExecutor:
    return HandExecutor()


@pytest.fixture
def service(tmp_path: Path, problems: Path, hand: HandExecutor) -> Iterator[Service]:
    yield from _open(tmp_path, problems, hand)


def test_identical_requests_in_flight_share_one_job_and_its_stored_verdict(service, hand):
    first = service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard")])[0]
    second = service.submit([Item("19_ReLU", HONEST_RELU + "\n\n", "standard")])[0]  # the same code, named otherwise
    assert len(hand.submitted) == 1 and service.in_flight == 1 and not first.done()
    verdict = hand.finish(hand.submitted[0])
    a, b = first.result(1), second.result(1)
    assert a.verdict == b.verdict == verdict and a.status == "correct" and a.reward == pytest.approx(0.3 + 2.0)
    assert not a.cached and not b.cached
    store = service.session.store
    assert store.get_verdicts([hand.submitted[0].key]) == {hand.submitted[0].key: verdict}
    answers = store.answers()
    assert [(x["reward_rule"], x["reward_version"], x["cached"]) for x in answers] == [("kernelbench-rl", 1, False)] * 2
    assert service.health()["joined"] == 1 and service.health()["pairs_evaluated"] == 1


def test_a_stored_verdict_is_answered_without_running_even_by_a_new_service(tmp_path, problems, hand):
    item = Item("L1/19_ReLU", HONEST_RELU, "verified")
    for service in _open(tmp_path, problems, hand):
        future = service.submit([item])[0]
        hand.finish(hand.submitted[0], speedup=1.5)
        assert future.result(1).cached is False
    again = HandExecutor()
    for service in _open(tmp_path, problems, again, reward="log-speedup"):  # a restart, another rule
        answer = service.evaluate([item], timeout_s=1)[0]
        assert again.submitted == [] and answer.cached and answer.status == "verified"
        assert answer.reward_rule == "log-speedup" and answer.reward == pytest.approx(1 + 0.405465, abs=1e-5)
        assert [a["reward_rule"] for a in service.session.store.answers()] == ["kernelbench-rl", "log-speedup"]


def test_both_protocols_are_two_jobs_and_the_verified_verdict_decides_the_reward(service, hand):
    future = service.submit([Item("L1/19_ReLU", WRONG_RELU, "both")])[0]
    assert sorted(j.protocol for j in hand.submitted) == ["standard", "verified"]
    for job in list(hand.submitted):
        hand.finish(job, status=Status.CORRECT if job.protocol == "standard" else Status.INCORRECT)
    answer = future.result(1)
    assert answer.status == "incorrect" and answer.reward == 0.0  # correct under standard earns nothing here
    body = answer.to_dict()
    assert body["standard"]["status"] == "correct" and body["verdict"]["protocol"] == "verified"


def test_a_batch_over_the_queue_limit_is_refused_whole_and_cached_items_take_no_room(tmp_path, problems, hand):
    for service in _open(tmp_path, problems, hand, Limits(max_queue=2)):
        service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard")])
        hand.finish(hand.submitted[0])  # now stored
        batch = [Item("L1/19_ReLU", HONEST_RELU, "standard"), Item("L1/19_ReLU", WRONG_RELU, "both")]
        futures = service.submit(batch)  # one cached, two new pairs: fits
        assert len(hand.submitted) == 3 and futures[0].result(1).cached
        with pytest.raises(ServiceError) as refused:
            service.submit([Item("L1/20_Other", HONEST_RELU, "standard")])
        assert refused.value.status == 429 and "queue is full" in str(refused.value)
        assert len(hand.submitted) == 3  # nothing of the refused batch was started
        assert service.submit([Item("L1/19_ReLU", WRONG_RELU, "verified")]) and len(hand.submitted) == 3  # joins


def test_an_unknown_problem_is_404_with_a_suggestion_and_nothing_is_admitted(service, hand):
    with pytest.raises(ServiceError) as unknown:
        service.submit([Item("L1/19_ReLU", HONEST_RELU), Item("L1/19_Relu_", HONEST_RELU)])
    assert unknown.value.status == 404 and str(unknown.value).startswith("items[1]: unknown problem 'L1/19_Relu_'.")
    assert "Did you mean L1/19_ReLU" in str(unknown.value) and hand.submitted == []


def test_draining_refuses_new_work_and_lets_the_admitted_finish(service, hand):
    future = service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard")])[0]
    service.drain()
    with pytest.raises(ServiceError) as refused:
        service.submit([Item("L1/20_Other", HONEST_RELU, "standard")])
    assert refused.value.status == 503 and service.health()["status"] == "draining"
    hand.finish(hand.submitted[0])
    assert future.result(1).status == "correct" and service.in_flight == 0


def test_an_abort_answers_the_waiting_with_503_and_stores_nothing_made_after_it(service, hand):
    future = service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard")])[0]
    job = hand.submitted[0]
    assert service.abort() == 1 and hand.aborted and service.state is State.STOPPED
    with pytest.raises(ServiceError) as stopped:
        future.result(1)
    assert stopped.value.status == 503 and "submit it again" in str(stopped.value)
    hand.finish(job)  # the killed child's verdict arrives late
    assert service.session.store.get_verdicts([job.key]) == {} and service.in_flight == 0


def test_a_problem_whose_own_code_fails_is_500_and_stored_as_a_problem_failure(service, hand):
    future = service.submit([Item("L1/20_Other", HONEST_RELU, "standard")])[0]
    hand.fail(hand.submitted[0], ProblemRunError("20_Other.py: get_inputs raised"))
    with pytest.raises(ServiceError) as failed:
        future.result(1)
    assert failed.value.status == 500 and "L1/20_Other cannot be evaluated" in str(failed.value)
    assert [f.problem for f in service.session.store.problem_failures()] == ["L1/20_Other"]
    # the server goes on: the next request is admitted
    service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard")])
    assert len(hand.submitted) == 2


def test_a_protocol_the_session_does_not_run_is_400(tmp_path, problems, hand):
    config = EvalConfig(candidates="serve", problems=str(problems), protocol="standard", device="cpu",
                        run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))
    with open_session(config, hand) as session:
        service = Service(session, load_problems(problems), reward_rule("correct"), Limits())
        with pytest.raises(ServiceError) as refused:
            service.submit([Item("L1/19_ReLU", HONEST_RELU, "verified")])
        assert refused.value.status == 400 and "does not run the verified protocol" in str(refused.value)


def test_the_candidate_is_named_after_its_code_so_identical_code_is_one_pair(service, hand):
    service.submit([Item("L1/19_ReLU", HONEST_RELU, "standard"), Item("L1/19_ReLU", WRONG_RELU, "standard"),
                    Item("L1/20_Other", HONEST_RELU, "standard")])
    names = [j.pair.candidate.name for j in hand.submitted]
    assert len(set(names)) == 3 and all(n.split("__")[0] in ("19_ReLU", "20_Other") for n in names)
    assert names[0].split("__")[1] == names[2].split("__")[1]  # same code, same hash, two problems
    assert not any(j.pair.candidate.no_code for j in hand.submitted)
    empty = Item("L1/19_ReLU", "# nothing here\n", "standard")
    service.submit([empty])
    assert hand.submitted[-1].pair.candidate.no_code
