"""Executors: where evaluation jobs run. Two methods, `submit` and `close`.

- `kbv.executors.local.LocalExecutor`: one lane: builds on a CPU pool, children started ahead, pairs
  evaluated one at a time on the device;
- `kbv.executors.lanes.LanesExecutor`: a lane per device of the machine (`--devices`), fed from one
  queue (what `kbv.api` runs, with one lane or many);
- `kbv.executors.ray.RayExecutor`: one Ray task per pair, on a cluster (`--executor ray`);
- `FakeExecutor` (here): answers every job from a function, so orchestration, resume, the store,
  reports and the CLI are tested without a device.

A protocol offers the executor a `ProtocolRunner`: prepare a problem once, evaluate each pair in a
child the executor started, release the problem.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from kbv.builds import Build
from kbv.candidates import Pair
from kbv.sandbox import Sandbox
from kbv.verdict import Verdict


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
