"""The service without HTTP: requests become jobs of one long run (`kbv.serve.app` is its front).

- A request names a problem among those served (else 404, with a suggestion) and brings code: a
  candidate named after its content hash, so the same code for the same problem is the same pair.
- Admission (`submit`), all or nothing for a batch, under one lock: each (pair, protocol) is answered
  from the store when its verdict is there (nothing runs); joins the job already evaluating it when
  there is one (identical requests in flight coalesce onto one job); else becomes a job of the
  session's executor, scheduled like one run's pairs (lanes, builds, children started ahead, problems
  kept prepared). A batch that would put more than `max_queue` pairs in flight is refused whole (429);
  so is everything while the service stops (503).
- A job's verdict is stored before anyone waiting on it is answered, so every answer is one that
  `kbv report` reads and a resubmission finds. Each answer is stored too, with its reward and the
  reward rule's name and version (`Store.put_answer`).
- Stopping: `drain` refuses new work and lets the admitted finish; `abort` kills every child (the
  executor's `abort`), never stores a verdict made by a killed child, and answers whoever still
  waits with 503. What was stored stays stored: the store is the service's only state.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Any

from kbv.answer import Answer
from kbv.api import RunSession
from kbv.candidates import Candidate, Pair, has_code
from kbv.errors import ProblemError, ServiceError, did_you_mean, first_line
from kbv.executors import Job
from kbv.problems import Problem, content_hash, resolve_problem
from kbv.reward_rules import RewardRule
from kbv.serve.requests import Item, Limits
from kbv.verdict import ProblemFailure, Verdict


class State(str, enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"  # no new work; the admitted finish
    STOPPED = "stopped"  # aborted: children killed, the waiting answered 503


def candidate_of(problem: Problem, code: str) -> Candidate:
    """The candidate a request's code makes: named after the problem and the code's content hash."""
    digest = content_hash(code)[:12]
    return Candidate(code=code, name=f"{problem.name}__{digest}", origin=f"request:{digest}",
                     problem_ref=problem.key, no_code=not has_code(code))


class Service:
    """Evaluation requests against `problems`, on `session` (whose store and executor it uses and
    does not close), rewarded by `rule`, within `limits`. `about` joins what `health` says."""

    def __init__(self, session: RunSession, problems: Sequence[Problem], rule: RewardRule, limits: Limits,
                 about: dict[str, Any] | None = None) -> None:
        self.session = session
        self.rule = rule
        self.limits = limits
        self.about = dict(about or {})
        self._problems = {p.key: p for p in problems}
        self._lock = threading.RLock()  # re-entered when a job finishes inside its own submission
        self._in_flight: dict[str, Future[Verdict]] = {}  # pair key -> its verdict, once stored
        self._state = State.SERVING
        self._counts: Counter[str] = Counter()
        self._started = time.monotonic()

    # -- requests -----------------------------------------------------------------------------------
    def problem(self, ref: str) -> Problem:
        """The served problem `ref` names ('L1/2_ReLU', or '2_ReLU' where that is one). Raises
        ServiceError 404 with the nearest names."""
        found = self._problems.get(ref)
        if found is not None:
            return found
        matches = resolve_problem(list(self._problems.values()), ref)
        if len(matches) == 1:
            return matches[0]
        shown = ref.encode("ascii", "backslashreplace").decode()[:120]
        if matches:
            raise ServiceError(404, f"problem '{shown}' is ambiguous: {', '.join(p.key for p in matches)}")
        names = list(self._problems) if "/" in ref else [p.name for p in self._problems.values()]
        raise ServiceError(404, f"unknown problem '{shown}'.{did_you_mean(ref, names)}".rstrip("."))

    def submit(self, items: Sequence[Item]) -> list[Future[Answer]]:
        """Admit `items`, all or none; each future holds its answer, or a ServiceError (500: the
        problem's own code or kbv failed; 503: the service stopped first). Raises ServiceError 404,
        400 (a protocol this service does not run), 429 (the queue is full), 503 (stopping)."""
        where = (lambda i: f"items[{i}]: ") if len(items) > 1 else (lambda i: "")
        pairs = [self._pair(item, where(i)) for i, item in enumerate(items)]
        with self._lock:
            if self._state is not State.SERVING:
                raise ServiceError(503, "the service is stopping and takes no new requests")
            wanted = {}  # key -> job, in request order
            for item, pair in zip(items, pairs):
                for protocol in item.protocols:
                    job = self.session.job(pair, protocol)
                    wanted.setdefault(job.key, job)
            fresh = [key for key in wanted if key not in self._in_flight]
            records = self.session.store.get_verdict_data(fresh)
            stored = {key: Verdict.from_dict(data) for key, data in records.items()}
            new = [wanted[key] for key in fresh if key not in stored]
            if new and len(self._in_flight) + len(new) > self.limits.max_queue:
                raise ServiceError(429, f"the queue is full ({len(self._in_flight)} pairs in flight, the limit is "
                                        f"{self.limits.max_queue}; this request adds {len(new)}): retry later")
            futures = {key: _done(verdict) for key, verdict in stored.items()}
            joined = [key for key in wanted if key in self._in_flight]
            futures.update((key, self._in_flight[key]) for key in joined)
            for job in new:
                futures[job.key] = self._start(job)
            self._counts["joined"] += len(joined)
        return [self._answer(item, pair, {p: self.session.key(pair, p) for p in item.protocols}, futures, records)
                for item, pair in zip(items, pairs)]

    def evaluate(self, items: Sequence[Item], timeout_s: float | None = None) -> list[Answer]:
        """`submit`, then wait for every answer (for callers without an event loop)."""
        return [fut.result(timeout_s) for fut in self.submit(items)]

    def _pair(self, item: Item, where: str) -> Pair:
        if any(p not in self.session.runners for p in item.protocols):
            raise ServiceError(400, f"{where}this service does not run the {item.protocol} protocol")
        try:
            problem = self.problem(item.problem)
        except ServiceError as exc:
            raise ServiceError(exc.status, f"{where}{exc}") from None
        return Pair(problem, candidate_of(problem, item.code))

    def _start(self, job: Job) -> Future[Verdict]:
        """Submit `job` (under the lock); the future completes once its verdict is stored."""
        fut: Future[Verdict] = Future()
        self._in_flight[job.key] = fut
        try:
            inner = self.session.executor.submit(job)
        except RuntimeError as exc:  # its pools were shut down under us: the service is stopping
            self._in_flight.pop(job.key, None)
            raise ServiceError(503, f"the service is stopping ({exc})") from None
        inner.add_done_callback(partial(self._finished, job, fut))
        return fut

    def _finished(self, job: Job, fut: Future[Verdict], inner: Future[Verdict]) -> None:
        """Store the job's verdict (never one made after an abort: its child was killed), then
        answer whoever waits on it."""
        outcome: Verdict | ServiceError
        try:
            verdict = inner.result()
        except ProblemError as exc:
            problem = job.pair.problem
            outcome = ServiceError(500, f"problem {problem.key} cannot be evaluated under the {job.protocol} "
                                        f"protocol (its own code failed): {exc}")
            if self._state is not State.STOPPED:
                self.session.store.put_problem_failure(
                    job.key, ProblemFailure(problem.key, str(exc), job.protocol, problem.hash))
        except BaseException as exc:  # cancelled by an abort, or a lane that failed for good
            outcome = _stopped() if self._state is State.STOPPED else ServiceError(
                500, f"kbv failed on this pair: {type(exc).__name__}: {first_line(exc)}")
        else:
            outcome = _stopped() if self._state is State.STOPPED else self._store(job, verdict)
        with self._lock:
            if self._in_flight.get(job.key) is fut:
                del self._in_flight[job.key]
        _settle(fut, outcome)

    def _store(self, job: Job, verdict: Verdict) -> Verdict | ServiceError:
        try:
            self.session.store.put_verdict(job.key, verdict)
        except Exception as exc:  # the database is gone (a full disk): say so, keep serving
            return ServiceError(500, f"kbv could not store the verdict: {type(exc).__name__}: {first_line(exc)}")
        with self._lock:
            self._counts["pairs_evaluated"] += 1
        return verdict

    def _answer(self, item: Item, pair: Pair, keys: dict[str, str], futures: dict[str, Future[Verdict]],
                records: dict[str, dict[str, Any]]) -> Future[Answer]:
        """The answer to `item`, once the verdicts of its `keys` (protocol -> key) are all in;
        `records`: those the store held at admission, as it holds them."""
        answer: Future[Answer] = Future()
        parts = {protocol: futures[key] for protocol, key in keys.items()}
        cached = all(key in records for key in keys.values())
        stored = {protocol: records[key] for protocol, key in keys.items() if key in records}

        def then() -> None:
            failed = [f.exception() for f in parts.values() if f.exception() is not None]
            if failed:
                _settle(answer, failed[0] if isinstance(failed[0], ServiceError) else ServiceError(500, str(failed[0])))
                return
            made = Answer.of(pair.problem.key, item.protocol, {p: f.result() for p, f in parts.items()}, self.rule,
                             cached, stored)
            try:
                self.session.store.put_answer(made.record(list(keys.values())))
            except Exception as exc:
                _settle(answer, ServiceError(500, f"kbv could not store the answer: {type(exc).__name__}: {exc}"))
                return
            with self._lock:
                self._counts["answers"] += 1
                self._counts["cached_answers"] += cached
            _settle(answer, made)

        _when_all(list(parts.values()), then)
        return answer

    # -- state ------------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._state

    @property
    def in_flight(self) -> int:
        """Pairs admitted and not yet answered."""
        with self._lock:
            return len(self._in_flight)

    def health(self) -> dict[str, Any]:
        settings = self.session.settings
        with self._lock:
            counts, depth = dict(self._counts), len(self._in_flight)
        return {
            "status": "ok" if self._state is State.SERVING else self._state.value,
            **self.about,
            "device": settings.device, "device_name": settings.provenance.get("device_name"),
            "run": str(settings.run_dir), "problems": list(self._problems),
            "protocols": list(self.session.runners), "queue": {"depth": depth, "max": self.limits.max_queue},
            "pairs_evaluated": counts.get("pairs_evaluated", 0), "answers": counts.get("answers", 0),
            "cached_answers": counts.get("cached_answers", 0), "joined": counts.get("joined", 0),
            "reward": self.rule.describe(), "limits": self.limits.to_dict(),
            "uptime_s": round(time.monotonic() - self._started, 1),
        }

    def drain(self) -> None:
        """Take no new requests; what was admitted goes on."""
        with self._lock:
            if self._state is State.SERVING:
                self._state = State.DRAINING

    def abort(self) -> int:
        """Stop now: kill every child, store nothing more, answer the waiting with 503. Returns how
        many pairs were still in flight."""
        with self._lock:
            if self._state is State.STOPPED:
                return 0
            self._state = State.STOPPED
            waiting = list(self._in_flight.values())
        self.session.executor.abort()
        for fut in waiting:
            _settle(fut, _stopped())
        return len(waiting)


def _stopped() -> ServiceError:
    return ServiceError(503, "the service stopped before this pair finished; nothing was stored for it: submit it again")


def _done(verdict: Verdict) -> Future[Verdict]:
    fut: Future[Verdict] = Future()
    fut.set_result(verdict)
    return fut


def _settle(fut: Future[Any], outcome: Any) -> None:
    """Complete `fut` with `outcome` (an exception is set as one), unless it is complete already
    (an abort answered it first)."""
    try:
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
    except InvalidStateError:
        pass


def _when_all(futures: list[Future[Any]], then: Callable[[], None]) -> None:
    """Call `then` once, when every one of `futures` is complete (at once if they are)."""
    left = [len(futures)]
    lock = threading.Lock()

    def one(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for fut in futures:
        fut.add_done_callback(one)
