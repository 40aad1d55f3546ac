"""Executors: where evaluation jobs run. Two methods, `submit` and `close`.

`LocalExecutor` builds compiled candidates in parallel on CPU workers (`jobs` at a time) and
evaluates pairs one at a time on the device (timing needs the device to itself), in submission order,
so that each problem is prepared once for all its candidates. `FakeExecutor` answers from a function:
orchestration, the store, reports and the CLI are tested through it without a device.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kbv.builds import Build, build_candidate, build_key, needs_build, prepare_candidate
from kbv.candidates import Pair
from kbv.errors import ProblemError
from kbv.settings import Settings
from kbv.verdict import Status, TimingStats, Verdict


@dataclass(frozen=True)
class Job:
    pair: Pair
    protocol: str  # "standard" | "verified"
    key: str  # resume key in the store


class Executor(abc.ABC):
    @abc.abstractmethod
    def submit(self, job: Job) -> Future[Verdict]:
        """Start `job`; the future holds its verdict, or a ProblemError if the problem itself failed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop workers; pending jobs are cancelled."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeExecutor(Executor):
    """Answers every job with `answer(job)` (a Verdict, or an exception to raise)."""

    def __init__(self, answer: Callable[[Job], Verdict]) -> None:
        self.answer = answer
        self.submitted: list[Job] = []

    def submit(self, job: Job) -> Future[Verdict]:
        self.submitted.append(job)
        fut: Future[Verdict] = Future()
        try:
            fut.set_result(self.answer(job))
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    def close(self) -> None:
        pass


class BaselineCache(Protocol):
    def get_baseline(self, key: str) -> TimingStats | None: ...
    def put_baseline(self, key: str, problem_hash: str, name: str, stats: TimingStats) -> None: ...


class ProtocolRunner(Protocol):
    """What a protocol offers the executor (see `kbv.runners`)."""

    name: str

    def prepare(self, pair: Pair) -> Any: ...
    def evaluate(self, pair: Pair, context: Any, build: Build) -> Verdict: ...
    def release(self, context: Any) -> None: ...
    def blank(self, pair: Pair) -> Verdict: ...


class LocalExecutor(Executor):
    """Builds on a CPU pool, evaluates sequentially on one device."""

    def __init__(self, settings: Settings, runners: dict[str, ProtocolRunner]) -> None:
        self.settings = settings
        self.runners = runners
        self._builds = ThreadPoolExecutor(max_workers=max(1, settings.jobs), thread_name_prefix="kbv-build")
        self._eval = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbv-eval")
        self._build_futures: dict[str, Future[Build]] = {}
        self._lock = threading.Lock()
        self._contexts: dict[str, tuple[str, Any]] = {}  # protocol -> (problem hash, context)

    def submit(self, job: Job) -> Future[Verdict]:
        build = self._start_build(job.pair)
        return self._eval.submit(self._evaluate, job, build)

    def _start_build(self, pair: Pair) -> Future[Build]:
        cand = pair.candidate
        if cand.no_code or not needs_build(cand):
            done: Future[Build] = Future()
            done.set_result(prepare_candidate(cand, self.settings) if not cand.no_code else None)  # type: ignore[arg-type]
            return done
        key = build_key(cand, self.settings)
        with self._lock:
            if key not in self._build_futures:
                self._build_futures[key] = self._builds.submit(build_candidate, cand, self.settings, key[:12])
            return self._build_futures[key]

    def _evaluate(self, job: Job, build_future: Future[Build]) -> Verdict:
        runner = self.runners[job.protocol]
        pair = job.pair
        early = self._early_verdict(job)
        if early is not None:
            return early
        build = build_future.result()
        context = self._context(runner, pair)
        return self._maybe_skipped(runner.evaluate(pair, context, build), pair)

    def _maybe_skipped(self, verdict: Verdict, pair: Pair) -> Verdict:
        """A candidate whose backend this device cannot run, and which failed to build or run here,
        is skipped rather than counted as a failure (a CUDA kernel on --device cpu). One that ran (a
        silent fallback to PyTorch, say) keeps its verdict."""
        backend = pair.candidate.backend
        failed = verdict.status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CUDA_ERROR)
        if failed and not backend.runs_on(self.settings.device_type):
            return replace(verdict, status=Status.SKIPPED, categories=(),
                           message=f"a {backend.value} candidate cannot run on {self.settings.device} "
                                   f"({verdict.message[:150]})")
        return verdict

    def _early_verdict(self, job: Job) -> Verdict | None:
        """Verdicts decided without running anything: a generated reply without code."""
        if job.pair.candidate.no_code:
            runner = self.runners[job.protocol]
            return replace(runner.blank(job.pair), status=Status.NO_CODE, message="the reply held no code block")
        return None

    def _context(self, runner: ProtocolRunner, pair: Pair) -> Any:
        """The prepared problem (one held per protocol); a problem that failed to prepare fails again."""
        held = self._contexts.get(runner.name)
        if held is not None and held[0] == pair.problem.hash:
            if isinstance(held[1], ProblemError):
                raise held[1]
            return held[1]
        if held is not None:
            self._contexts.pop(runner.name)
            if not isinstance(held[1], ProblemError):
                runner.release(held[1])
        try:
            context = runner.prepare(pair)
        except ProblemError as exc:
            self._contexts[runner.name] = (pair.problem.hash, exc)
            raise
        self._contexts[runner.name] = (pair.problem.hash, context)
        return context

    def close(self) -> None:
        self._eval.shutdown(wait=True, cancel_futures=True)
        self._builds.shutdown(wait=True, cancel_futures=True)
        for runner_name, (_, context) in list(self._contexts.items()):
            if not isinstance(context, ProblemError):
                self.runners[runner_name].release(context)
        self._contexts.clear()
