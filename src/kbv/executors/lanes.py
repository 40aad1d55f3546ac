"""Every device of one machine: its evaluation lanes (one per GPU of `--devices`, `--pairs-per-device`
each), one build pool, one writer.

- A lane is a `LocalExecutor` on a device: its own runners, eval thread, children started ahead and
  prepared problems. Lanes on the same device (CPU lanes, `--pairs-per-device`) share that device's
  gate (`kbv.gate`): their untimed work overlaps, and what one lane times or measures is disturbed by
  nothing of another's, its children coming up included.
- Builds run on one shared CPU pool, each content hash once (`BuildPool`), all started as the pairs
  are submitted.
- Pairs go to a lane when it has room (`WINDOW` pairs: the one evaluating and those whose children are
  started ahead), and only once their build is ready: a pair whose build is done runs while an
  earlier pair's build still compiles, and a candidate that needs no build never waits behind nvcc.
  Among ready pairs, `pick_next` chooses: more of a problem the lane holds prepared, else a problem
  no lane holds (one whose pairs are all ready first), else, once the lane has finished its pairs,
  the problem with the most ready pairs. So a problem is prepared on one lane, once per protocol
  while the lane holds it (up to `HELD_PER_PROTOCOL` per protocol, as the lane does), and on a second
  lane only when that keeps a lane from idling.
- A lane whose evaluation raises anything but a ProblemError (its device died, kbv failed on it) has
  the pair queued once more, on another lane where there is one; a second failure makes the pair
  `crashed` with both reasons. One that ran kbv's own process out of memory is a `RunFailure`
  instead: stored, never a verdict, and tried again when the run resumes. A lane that fails `RETIRE_AFTER` pairs in a row takes no more; with no
  lane left, the pairs still waiting fail with HarnessError (a broken harness raises).
- Futures complete as verdicts arrive; the caller (`kbv.api`) stores them, the only writer, in
  the problems' order whatever the order they complete in.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

from kbv.builds import Build, BuildPool, BuildState
from kbv.errors import HarnessError, ProblemError, RunFailure, first_line
from kbv.executors import Executor, Job, ProtocolRunner, RunState
from kbv.executors.local import HELD_PER_PROTOCOL, PRESTART
from kbv.placement import NO_PLAN, enter_starter_thread
from kbv.problems import out_of_memory
from kbv.settings import Settings
from kbv.verdict import Status, Verdict

WINDOW = PRESTART + 1  # pairs handed to a lane at a time
ATTEMPTS = 2  # a pair whose lane failed is queued once more
RETIRE_AFTER = 3  # failed pairs in a row that take a lane out of the run


Group = tuple[str, str]  # (protocol, problem hash): what a lane prepares once


@dataclass(frozen=True)
class Waiting:
    """A pending pair as `pick_next` sees it."""

    group: Group
    ready: bool = True  # its build is done, or it needs none
    avoid: int | None = None  # the lane that failed it


def pick_next(pending: Sequence[Waiting], lane: int, mine: Collection[Group], others: Collection[Group],
              idle: bool) -> int | None:
    """The index in `pending` (in submission order) of the pair that `lane` takes next, among those
    ready: the first of a group the lane holds (`mine`); else the first of a group no lane holds
    (`others`: what the other lanes hold), a group with no pair still building first (prepared once,
    it is finished at once); else, when the lane is `idle`, the first of the group with the most
    ready pairs. None when there is nothing it should take now."""
    allowed = [i for i, w in enumerate(pending) if w.avoid != lane and w.ready]
    for i in allowed:
        if pending[i].group in mine:
            return i
    fresh = [i for i in allowed if pending[i].group not in others]
    if fresh:
        building = {w.group for w in pending if not w.ready}
        return next((i for i in fresh if pending[i].group not in building), fresh[0])
    if not idle or not allowed:
        return None
    left = Counter(pending[i].group for i in allowed)
    most = max(left.values())
    return next(i for i in allowed if left[pending[i].group] == most)


class Lane(Protocol):
    """What a lane offers (`kbv.executors.local.LocalExecutor`; a fake in tests)."""

    settings: Settings
    runners: dict[str, ProtocolRunner]

    def submit(self, job: Job) -> Future[Verdict]: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...
    def state(self) -> RunState: ...


@dataclass
class _Entry:
    """A submitted job, its caller's future, and the lane failures it has met."""

    job: Job
    future: Future[Verdict] = field(default_factory=Future)
    failures: list[str] = field(default_factory=list)  # "device: reason", one per failed attempt
    trace: str = ""
    avoid: int | None = None  # the lane that failed it
    build: Future[Build] | None = None  # None: nothing to build (or no pool to build it)
    submitted: float = field(default_factory=time.monotonic)

    @property
    def group(self) -> Group:
        return (self.job.protocol, self.job.pair.problem.hash)

    @property
    def ready(self) -> bool:
        return self.build is None or self.build.done()


@dataclass
class _Lane:
    index: int
    executor: Lane
    # protocol -> problems it holds prepared, the latest last: the lane's own choice (it releases the
    # least recently used beyond HELD_PER_PROTOCOL), followed as pairs are handed to it
    held: dict[str, list[str]] = field(default_factory=dict)
    in_flight: int = 0
    failed_in_a_row: int = 0
    retired: bool = False

    @property
    def device(self) -> str:
        return self.executor.settings.device

    def groups(self) -> set[Group]:
        return {(protocol, problem) for protocol, problems in self.held.items() for problem in problems}

    def take(self, group: Group) -> None:
        protocol, problem = group
        held = self.held.setdefault(protocol, [])
        if problem in held:
            held.remove(problem)
        held.append(problem)
        del held[:-HELD_PER_PROTOCOL]


class LanesExecutor(Executor):
    """Several lanes fed from one queue; `builds` is their shared pool (closed here)."""

    def __init__(self, lanes: Sequence[Lane], builds: BuildPool | None = None) -> None:
        assert lanes, "at least one lane"
        self._lanes = [_Lane(i, lane) for i, lane in enumerate(lanes)]
        self._builds = builds
        self._pending: list[_Entry] = []
        self._lock = threading.Lock()
        self._aborted = False
        self.lanes = len(lanes)
        self.plan = getattr(builds, "plan", None)
        plan = self.plan or NO_PLAN
        # started here, by the caller's thread, so that it has that thread's (normal) priority; on
        # the build cores, off the lanes'
        self._dispatch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbv-dispatch",
                                            initializer=enter_starter_thread, initargs=(plan,))
        self._dispatch.submit(lambda: None).result()

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(lane.device for lane in self._lanes)

    def submit(self, job: Job) -> Future[Verdict]:
        """Queue `job`, its build started at once (the pair goes to a lane when the build is ready)."""
        entry = _Entry(job, build=self._builds.start(job.pair) if self._builds is not None else None)
        with self._lock:
            self._pending.append(entry)
        if entry.build is not None and not entry.build.done():
            entry.build.add_done_callback(self._build_done)
        self._fill(join=False)  # more may follow at once: joining a held problem waits for a lane to free
        return entry.future

    def _build_done(self, _: Future[Build]) -> None:
        """Runs on the build's thread, which has the builds' priority and cores, and so would give
        them to any thread it started (a lane's evaluation thread, whose children are timed): the
        pairs are handed on the dispatch thread instead."""
        with contextlib.suppress(RuntimeError):  # shut down: nothing more is handed
            self._dispatch.submit(self._fill)

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
                    others = set().union(*(other.groups() for other in live if other is not lane))
                    view = [Waiting(e.group, e.ready, e.avoid) for e in self._pending]
                    i = pick_next(view, lane.index, lane.groups(), others, idle=join and lane.in_flight == 0)
                    if i is None:
                        continue
                    entry = self._pending.pop(i)
                    lane.take(entry.group)
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
        elif out_of_memory(exc):  # kbv's own process ran out of memory: the run's failure, not the candidate's
            entry.future.set_exception(RunFailure(_own_memory_failure(lane.device, entry.job, exc)))
        else:
            self._lane_failed(lane, entry, exc)
        self._fill()

    def _lane_failed(self, lane: _Lane, entry: _Entry, exc: BaseException) -> None:
        """Queue the pair once more (another lane first), or make it `crashed` after its second failure."""
        entry.failures.append(f"{lane.device}: {type(exc).__name__}: {first_line(exc) if str(exc).strip() else ''}")
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

    # -- what it is doing -----------------------------------------------------------------------------
    def state(self) -> RunState:
        builds = self._builds.state() if self._builds is not None else BuildState()
        evaluating = tuple(line for lane in self._lanes if hasattr(lane.executor, "state")
                           for line in lane.executor.state().evaluating)
        next_pair, waits_for = self._next_waiting()
        return RunState.of_builds(builds, evaluating=evaluating, next_pair=next_pair, next_waits_for=waits_for)

    def _next_waiting(self) -> tuple[str | None, str | None]:
        """The pending pair nearest to running, and what it waits for."""
        with self._lock:
            pending = list(self._pending)
            full = all(lane.in_flight >= WINDOW or lane.retired for lane in self._lanes)
        if not pending:
            return None, None
        ready = [e for e in pending if e.ready]
        if ready:
            return _name(ready[0].job), "a lane" if full else "a lane free of the problems others hold"
        builds = self._builds
        progress = [(builds.progress_of(e.job.pair) if builds is not None else None, e) for e in pending]
        running = [(p, e) for p, e in progress if p and p.startswith("running")]
        where, entry = running[0] if running else progress[0]
        return _name(entry.job), f"its build ({where})" if where else "its build"

    # -- stopping -------------------------------------------------------------------------------------
    def abort(self) -> None:
        with self._lock:
            self._aborted = True
        self._dispatch.shutdown(wait=False, cancel_futures=True)
        for lane in self._lanes:
            lane.executor.abort()
        if self._builds is not None:
            self._builds.shutdown(wait=False)

    def close(self) -> None:
        self._dispatch.shutdown(wait=not self._aborted, cancel_futures=True)
        for lane in self._lanes:
            lane.executor.close()
        if self._builds is not None:
            self._builds.shutdown(wait=not self._aborted)
        with self._lock:
            left, self._pending = self._pending, []
        for entry in left:
            entry.future.cancel()


def _own_memory_failure(device: str, job: Job, exc: BaseException) -> str:
    # the whole first line: PyTorch's names the device's free memory and every process's share of it
    return (f"{job.pair.problem.origin}: kbv itself ran out of memory on {device} while judging "
            f"{job.pair.candidate.name} under {job.protocol} ({first_line(exc, 1200)}): not the candidate's doing; no "
            "verdict is stored, and the pair is tried again when the run resumes")


def _name(job: Job) -> str:
    return f"{job.pair.problem.key}/{job.pair.candidate.name} {job.protocol}"
