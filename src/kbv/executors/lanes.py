"""Every device of one machine: one evaluation lane per GPU (`--devices`), one build pool, one writer.

- A lane is a `LocalExecutor` on its own device: its own runners, eval thread, children started ahead,
  prepared problems and quiet lock. Lanes on the same device (CPU lanes) share that device's lock, so
  that what one lane times is not disturbed by another's children coming up.
- Builds run on one shared CPU pool, each content hash once (`BuildPool`).
- Pairs go to a lane when it has room (`WINDOW` pairs: the one evaluating and those whose children are
  started ahead), chosen by `pick_next`: more of the problem the lane holds, else a problem no lane
  holds, else, once the lane has finished its pairs, the problem with the most pairs left. So a
  problem is prepared on one lane, and on a second only when that keeps a lane from idling.
- A lane whose evaluation raises anything but a ProblemError (its device died, kbv failed on it) has
  the pair queued once more, on another lane where there is one; a second failure makes the pair
  `crashed` with both reasons. A lane that fails `RETIRE_AFTER` pairs in a row takes no more; with no
  lane left, the pairs still waiting fail with HarnessError (a broken harness raises).
- Futures complete as verdicts arrive; the caller (`kbv.api`) stores them, the only writer.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

from kbv.errors import HarnessError, ProblemError
from kbv.executors import Executor, Job, ProtocolRunner
from kbv.executors.local import PRESTART, BuildPool
from kbv.settings import Settings
from kbv.verdict import Status, Verdict

WINDOW = PRESTART + 1  # pairs handed to a lane at a time
ATTEMPTS = 2  # a pair whose lane failed is queued once more
RETIRE_AFTER = 3  # failed pairs in a row that take a lane out of the run


def pick_next(pending: Sequence[tuple[str, int | None]], lane: int, current: str | None,
              held: Collection[str], idle: bool) -> int | None:
    """The index in `pending` ((problem hash, lane to avoid) in submission order) of the pair that
    `lane` takes next: the first of its `current` problem; else the first of a problem no other lane
    holds (`held`); else, when the lane is `idle`, the first of the problem with the most pairs left.
    None when there is nothing it should take now."""
    allowed = [i for i, (_, avoid) in enumerate(pending) if avoid != lane]
    for i in allowed:
        if pending[i][0] == current:
            return i
    for i in allowed:
        if pending[i][0] not in held:
            return i
    if not idle or not allowed:
        return None
    left = Counter(pending[i][0] for i in allowed)
    most = max(left.values())
    return next(i for i in allowed if left[pending[i][0]] == most)


class Lane(Protocol):
    """What a lane offers (`kbv.executors.local.LocalExecutor`; a fake in tests)."""

    settings: Settings
    runners: dict[str, ProtocolRunner]

    def submit(self, job: Job) -> Future[Verdict]: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class _Entry:
    """A submitted job, its caller's future, and the lane failures it has met."""

    job: Job
    future: Future[Verdict] = field(default_factory=Future)
    failures: list[str] = field(default_factory=list)  # "device: reason", one per failed attempt
    trace: str = ""
    avoid: int | None = None  # the lane that failed it


@dataclass
class _Lane:
    index: int
    executor: Lane
    current: str | None = None  # the problem of the last pair handed to it
    in_flight: int = 0
    failed_in_a_row: int = 0
    retired: bool = False

    @property
    def device(self) -> str:
        return self.executor.settings.device


class LanesExecutor(Executor):
    """Several lanes fed from one queue; `builds` is their shared pool (closed here)."""

    def __init__(self, lanes: Sequence[Lane], builds: BuildPool | None = None) -> None:
        assert lanes, "at least one lane"
        self._lanes = [_Lane(i, lane) for i, lane in enumerate(lanes)]
        self._builds = builds
        self._pending: list[_Entry] = []
        self._lock = threading.Lock()
        self._aborted = False

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(lane.device for lane in self._lanes)

    def submit(self, job: Job) -> Future[Verdict]:
        entry = _Entry(job)
        with self._lock:
            self._pending.append(entry)
        self._fill(join=False)  # more may follow at once: joining a held problem waits for a lane to free
        return entry.future

    # -- handing pairs to lanes ---------------------------------------------------------------------
    def _fill(self, join: bool = True) -> None:
        """Hand pending pairs to lanes with room; `join`: an idle lane may join a problem another holds."""
        handed, orphans = self._assign(join)
        for entry in orphans:
            entry.future.set_exception(HarnessError(
                f"every evaluation lane failed; last: {entry.failures[-1] if entry.failures else 'unknown'}"))
        for lane, entry in handed:
            try:
                inner = lane.executor.submit(entry.job)
            except RuntimeError as exc:  # the lane was shut down under us (an interrupt)
                entry.future.set_exception(exc)
                continue
            inner.add_done_callback(partial(self._finished, lane, entry))

    def _assign(self, join: bool) -> tuple[list[tuple[_Lane, _Entry]], list[_Entry]]:
        """Under the lock: which lane takes which pending entry now; and the entries no lane can take."""
        with self._lock:
            if self._aborted:
                return [], []
            live = [lane for lane in self._lanes if not lane.retired]
            if not live:
                orphans, self._pending = self._pending, []
                return [], orphans
            if len(live) == 1:  # nowhere else to go: a retried pair runs on the lane that failed it
                for entry in self._pending:
                    entry.avoid = None
            handed: list[tuple[_Lane, _Entry]] = []
            progress = True
            while progress and self._pending:  # a pair per lane per round, the least busy first
                progress = False
                for lane in sorted(live, key=lambda lane: (lane.in_flight, lane.index)):
                    if lane.in_flight >= WINDOW or not self._pending:
                        continue
                    held = {other.current for other in live if other is not lane and other.current}
                    view = [(e.job.pair.problem.hash, e.avoid) for e in self._pending]
                    i = pick_next(view, lane.index, lane.current, held, idle=join and lane.in_flight == 0)
                    if i is None:
                        continue
                    entry = self._pending.pop(i)
                    lane.current = entry.job.pair.problem.hash
                    lane.in_flight += 1
                    handed.append((lane, entry))
                    progress = True
            return handed, []

    # -- results --------------------------------------------------------------------------------------
    def _finished(self, lane: _Lane, entry: _Entry, inner: Future[Verdict]) -> None:
        with self._lock:
            lane.in_flight -= 1
        if inner.cancelled():
            entry.future.cancel()
            return
        exc = inner.exception()
        if exc is None or isinstance(exc, ProblemError):  # a verdict, or a problem's own failure
            with self._lock:
                lane.failed_in_a_row = 0
            if exc is None:
                entry.future.set_result(inner.result())
            else:
                entry.future.set_exception(exc)
        elif self._aborted:  # an interrupt killed the pair's child: nothing is retried
            entry.future.set_exception(exc)
        else:
            self._lane_failed(lane, entry, exc)
        self._fill()

    def _lane_failed(self, lane: _Lane, entry: _Entry, exc: BaseException) -> None:
        """Queue the pair once more (another lane first), or make it `crashed` after its second failure."""
        first_line = (str(exc).splitlines() or [""])[0][:300]
        entry.failures.append(f"{lane.device}: {type(exc).__name__}: {first_line}")
        entry.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        with self._lock:
            lane.failed_in_a_row += 1
            lane.retired = lane.retired or lane.failed_in_a_row >= RETIRE_AFTER
            if len(entry.failures) < ATTEMPTS:
                entry.avoid = lane.index
                self._pending.insert(0, entry)
                return
        entry.future.set_result(self._crashed(lane, entry))

    def _crashed(self, lane: _Lane, entry: _Entry) -> Verdict:
        runner = lane.executor.runners[entry.job.protocol]
        return replace(runner.blank(entry.job.pair), status=Status.CRASHED,
                       message=f"the evaluation lane failed on this pair {len(entry.failures)} times "
                               f"({'; '.join(entry.failures)})",
                       evidence={"lane_failures": list(entry.failures), "traceback": entry.trace})

    # -- stopping -------------------------------------------------------------------------------------
    def abort(self) -> None:
        with self._lock:
            self._aborted = True
        for lane in self._lanes:
            lane.executor.abort()
        if self._builds is not None:
            self._builds.shutdown(wait=False)

    def close(self) -> None:
        for lane in self._lanes:
            lane.executor.close()
        if self._builds is not None:
            self._builds.shutdown(wait=not self._aborted)
        with self._lock:
            left, self._pending = self._pending, []
        for entry in left:
            entry.future.cancel()
