"""Executors: where evaluation jobs run. Two methods, `submit` and `close`.

- `kbv.executors.local.LocalExecutor`: one lane: builds on a CPU pool, children started ahead, pairs
  evaluated one at a time on the device;
- `kbv.executors.lanes.LanesExecutor`: a lane per device of the machine (`--devices`), fed from one
  queue (what `kbv.api` runs, with one lane or many);
- `kbv.executors.ray.RayExecutor`: one Ray task per pair, on a cluster (`--executor ray`);
- `FakeExecutor` (here): answers every job from a function, so orchestration, resume, the store,
  reports and the CLI are tested without a device.

A protocol offers the executor a `ProtocolRunner`: prepare a problem once, evaluate each pair in a
child the executor started, release the problem. `state()` says what an executor is doing (builds
running, pairs evaluating, what the next pair waits for), for a run that says what it waits on.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from kbv.builds import Build, BuildState
from kbv.candidates import Pair
from kbv.sandbox import Sandbox
from kbv.verdict import Verdict


@dataclass(frozen=True)
class Job:
    pair: Pair
    protocol: str  # "standard" | "verified"
    key: str  # resume key in the store


@dataclass(frozen=True)
class RunState:
    """What a run is doing now, and what its builds have cost so far."""

    builds_running: int = 0
    builds_queued: int = 0
    oldest_build: str | None = None  # the candidate whose build has run longest
    oldest_build_s: float = 0.0
    evaluating: tuple[str, ...] = ()  # per busy lane: "cuda:0: problem/candidate protocol stage N s"
    next_pair: str | None = None  # the pair that runs next
    next_waits_for: str | None = None  # what it waits for ("its build (running 40 s)", "a lane", ...)
    builds_done: int = 0  # built in this run
    builds_cached: int = 0  # found built by an earlier run
    build_cpu_s: float = 0.0  # CPU-seconds of this run's builds
    build_wall_s: float = 0.0

    @classmethod
    def of_builds(cls, build: BuildState, **rest: Any) -> RunState:
        return cls(builds_running=build.running, builds_queued=build.queued, oldest_build=build.oldest,
                   oldest_build_s=build.oldest_s, builds_done=build.done, builds_cached=build.cached,
                   build_cpu_s=build.cpu_s, build_wall_s=build.wall_s, **rest)

    def describe(self) -> str:
        """One line: builds, lanes, and what the next pair waits for."""
        parts = []
        if self.builds_running or self.builds_queued:
            oldest = f" (oldest {self.oldest_build}, {self.oldest_build_s:.0f} s)" if self.oldest_build else ""
            parts.append(f"builds: {self.builds_running} running{oldest}, {self.builds_queued} queued")
        parts.extend(self.evaluating)
        if self.next_pair:
            parts.append(f"next: {self.next_pair}" + (f", waiting for {self.next_waits_for}"
                                                      if self.next_waits_for else ""))
        return "; ".join(parts) or "nothing running"


class Executor(abc.ABC):
    lanes: int = 1  # pairs it evaluates at once (for a run's busy share)
    plan: Any = None  # the machine's `kbv.placement.CorePlan`, where it runs builds and lanes here

    def state(self) -> RunState:
        """What it is doing now (by default: nothing it can say)."""
        return RunState()

    @abc.abstractmethod
    def submit(self, job: Job) -> Future[Verdict]:
        """Start `job`; the future holds its verdict, or a ProblemError if the problem itself failed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop workers; pending jobs are cancelled."""

    def abort(self) -> None:
        """An interrupt: stop at once (children killed, nothing pending run). `close` still follows."""
        self.close()

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


class ProtocolRunner(Protocol):
    """What a protocol offers the executor (`StandardRunner`, `VerifiedRunner`)."""

    name: str

    def fingerprint(self) -> str: ...
    def prepare(self, pair: Pair) -> Any: ...
    def evaluate(self, pair: Pair, prepared: Any, build: Build, sb: Sandbox) -> Verdict: ...
    def release(self, prepared: Any) -> None: ...
    def blank(self, pair: Pair) -> Verdict: ...
