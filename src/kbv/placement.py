"""Where builds and starting children run, so that neither can delay or distort a timing (§13).

A launch-bound kernel's time includes the host's launch path: a compiler on the timed child's core,
or a child importing torch there, shows up in its speedup (seen on an H200: 2x off KernelBench's own
figure while the build pool compiled on 14 of 16 cores). `--build-isolation` picks how kbv keeps them
apart; everything here is decided in one `CorePlan`:

- `pin`: every lane keeps whole cores of its own (`LANE_CPUS`): its evaluation thread, and the
  children it times (candidate and baseline), run there and nowhere else of ours does. Builds, and
  children while they start (interpreter, torch import), run on the other cores, builds at the lowest
  priority (SCHED_IDLE, nice 19). A started child moves to its lane's cores before its device comes up.
- `hold`: for machines too small to split. Builds run at the lowest priority on any core, and are
  stopped (SIGSTOP to their process groups) while a lane times a pair or measures its memory, then
  resumed; children starting up likewise. Time a build spends stopped does not count against its
  timeout.
- `none`: builds as any other process (the behaviour before; for benches that show the difference).
- `auto` (the default): `pin` on a GPU where every lane gets its cores and builds keep at least half
  of the machine, else `hold`. On `--device cpu` the cores are the device itself, so `auto` holds.

Linux only (affinity and priority are per thread there, and inherited by the processes a thread
starts, which is how builds get theirs without a `preexec_fn`); elsewhere every mode is `none`.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kbv.errors import UsageError
from kbv.gate import DeviceGate

if TYPE_CHECKING:
    from kbv.settings import Settings

LANE_CPUS = 2  # a lane's own: the timed child's thread and the parent's thread that drives it
# how many of a lane's CPUs the children it times share (0: all of the lane's). One: the candidate and
# its baselines run on the same CPU, so that no side times on a quicker or quieter one than the other
# (the scheduler keeps a woken process on the CPU it last ran on: two children on two CPUs stay apart)
CHILD_CPUS = 1
BUILD_NICE = 19


class Isolation(str, enum.Enum):
    AUTO = "auto"
    PIN = "pin"
    HOLD = "hold"
    NONE = "none"


def parse_isolation(text: str) -> Isolation:
    try:
        return Isolation(text.strip().lower())
    except ValueError:
        raise UsageError(f"Unknown build isolation '{text}': expected auto, pin, hold or none.") from None


@dataclass(frozen=True)
class CorePlan:
    """Which CPUs each lane keeps, which the builds get, and whether builds are held while timing.

    `lanes[i]` are lane i's own CPUs and `builds` the rest; both empty when nothing is pinned."""

    mode: Isolation  # resolved: PIN, HOLD or NONE
    lanes: tuple[frozenset[int], ...]
    builds: frozenset[int]
    cpus: int  # usable CPUs of this process

    @property
    def pinned(self) -> bool:
        return bool(self.builds)

    @property
    def holds(self) -> bool:
        return self.mode is Isolation.HOLD

    @property
    def build_cpus(self) -> int:
        """CPUs builds may use: the pool is sized by it."""
        return len(self.builds) if self.pinned else self.cpus

    def lane_cpus(self, lane: int) -> frozenset[int]:
        return self.lanes[lane % len(self.lanes)] if self.lanes else frozenset()

    def child_cpus(self, lane: int) -> frozenset[int]:
        """Where every child of lane `lane` runs once started: the same CPU for the candidate and its
        baselines (`CHILD_CPUS`), the lane's lowest."""
        cpus = sorted(self.lane_cpus(lane))
        return frozenset(cpus[:CHILD_CPUS] if CHILD_CPUS else cpus)

    def driver_cpus(self, lane: int) -> frozenset[int]:
        """Where the lane's own thread runs: its CPUs but the children's, where it has others."""
        return (self.lane_cpus(lane) - self.child_cpus(lane)) or self.lane_cpus(lane)

    def describe(self) -> str:
        if self.pinned:
            lanes = "; ".join(f"lane {i}: {_ranges(c)}" for i, c in enumerate(self.lanes))
            return f"pin ({lanes}; builds: {_ranges(self.builds)})"
        return self.mode.value


NO_PLAN = CorePlan(Isolation.NONE, (), frozenset(), 0)  # nothing pinned, niced or held


def plan_cores(mode: Isolation, lanes: int, device_type: str, cpus: Sequence[int],
               siblings: Mapping[int, frozenset[int]] | None = None) -> CorePlan:
    """The plan for `lanes` lanes on `cpus` (this process's usable CPUs). `siblings` maps a CPU to
    the CPUs of its physical core (SMT): a lane takes whole cores, so that no build shares one with a
    timed child. A pure function (see `current_plan` for this machine's)."""
    cpus = sorted(set(cpus))
    lanes = max(1, lanes)
    if mode is Isolation.NONE or not _supported():
        return CorePlan(Isolation.NONE, (), frozenset(), len(cpus))
    if mode is Isolation.HOLD:
        return CorePlan(Isolation.HOLD, (), frozenset(), len(cpus))
    for per_lane in (LANE_CPUS, 1):  # a lane's own cores, fewer where the machine is small
        reserved = _reserve(lanes, per_lane, cpus, siblings or {})
        taken = frozenset().union(*reserved) if reserved else frozenset()
        rest = frozenset(cpus) - taken
        fits = bool(reserved) and bool(rest)
        if mode is Isolation.AUTO:
            fits = fits and device_type == "cuda" and len(taken) * 2 <= len(cpus)
        if fits:
            return CorePlan(Isolation.PIN, tuple(reserved), rest, len(cpus))
    return CorePlan(Isolation.HOLD, (), frozenset(), len(cpus))


def _reserve(lanes: int, per_lane: int, cpus: Sequence[int],
             siblings: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    """Whole physical cores for each lane, from the highest-numbered down (CPU 0 takes most of the
    kernel's housekeeping), until each has `per_lane` CPUs. Empty when they do not fit."""
    cores: list[frozenset[int]] = []
    for cpu in sorted(cpus, reverse=True):
        core = frozenset(siblings.get(cpu, frozenset({cpu}))) & frozenset(cpus) or frozenset({cpu})
        if core not in cores:
            cores.append(core)
    out = []
    for _ in range(lanes):
        mine: set[int] = set()
        while len(mine) < per_lane and cores:
            mine |= cores.pop(0)
        if not mine:
            return []
        out.append(frozenset(mine))
    return out


def current_plan(mode: Isolation | str, lanes: int, device_type: str) -> CorePlan:
    """The plan on this machine, for this process's CPUs."""
    mode = parse_isolation(mode) if isinstance(mode, str) else mode
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return plan_cores(mode, lanes, device_type, cpus, _siblings(cpus))


def _siblings(cpus: Sequence[int]) -> dict[int, frozenset[int]]:
    out = {}
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            out[cpu] = frozenset(_parse_ranges(path.read_text()))
        except (OSError, ValueError):
            out[cpu] = frozenset({cpu})
    return out


def _parse_ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _ranges(cpus: frozenset[int]) -> str:
    ordered, parts = sorted(cpus), []
    start = prev = ordered[0] if ordered else 0
    for cpu in ordered[1:] + [None]:  # type: ignore[list-item]
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts) if ordered else "-"


def _supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "setpriority")


# -- threads and processes --------------------------------------------------------------------------
# On Linux, affinity and priority belong to a thread, and a process a thread starts inherits both:
# each of these is called at the start of a pool thread, and every child that thread starts (a build's
# sandbox child, its ninja and compilers) runs where and how the thread does.

def enter_build_thread(plan: CorePlan) -> None:
    """A build pool's thread: the build cores, the lowest priority."""
    if plan.mode is Isolation.NONE:
        return
    if plan.pinned:
        _pin_thread(plan.builds)
    lower_priority()


def enter_starter_thread(plan: CorePlan) -> None:
    """The thread that starts children: the build cores (the child moves to its lane when started),
    at normal priority, so that a child starting is not slowed by the builds."""
    if plan.pinned:
        _pin_thread(plan.builds)


def enter_lane_thread(plan: CorePlan, lane: int) -> None:
    """A lane's evaluation thread: the lane's cores but its children's (the reference and baseline
    children it starts are born there, and move to the children's CPU as their device comes up)."""
    if plan.pinned:
        _pin_thread(plan.driver_cpus(lane))


@contextlib.contextmanager
def off_lanes(plan: CorePlan | None) -> Iterator[None]:
    """The calling thread (a run's driving thread: it stores verdicts, prints, submits) on the build
    cores for the block, at normal priority, and back where it was after."""
    if plan is None or not plan.pinned:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    _pin_thread(plan.builds)
    try:
        yield
    finally:
        _pin_thread(before)


def lane_settings(settings: Settings, plan: CorePlan, lane: int) -> Settings:
    """`settings` for the children lane `lane` times: on its children's CPUs (moved there as their
    device comes up), with as many OpenMP threads (they import torch on the build cores, where
    OpenMP would count those). Unchanged where nothing is pinned."""
    if not plan.pinned:
        return settings
    cpus = tuple(sorted(plan.child_cpus(lane)))
    return replace(settings, child_threads=len(cpus), child_cpus=cpus)


def lower_priority() -> None:
    """The calling thread (and what it starts) at nice 19 and, where allowed, SCHED_IDLE: it runs
    only on a CPU nothing else of ours wants."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, BUILD_NICE)
    if hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _pin_thread(cpus: frozenset[int]) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


def move_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of process `pid` and of its descendants onto `cpus` (their later threads and
    children follow). A sandboxed child is bwrap's child: moving bwrap alone leaves it where it was."""
    for tid in _tree_threads(pid):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)


def pin_self(cpus: Sequence[int]) -> list[int]:
    """Every thread of this process onto `cpus` (a child, as its device comes up: it needs no
    privilege over its own threads, where the parent may have none over a sandbox's user); the CPUs
    it runs on after."""
    for tid in _tree_threads(os.getpid(), children=False):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, set(cpus))
    return sorted(os.sched_getaffinity(0))


def _tree_threads(pid: int, children: bool = True) -> list[int]:
    """The threads of `pid` and (with `children`) of every process below it."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            tids = [p]
        out += tids
        if children:
            for tid in tids:
                with contextlib.suppress(OSError, ValueError):
                    todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
    return out


def thread_cpus(pid: int) -> list[frozenset[int]]:
    """The CPUs each thread of `pid` and of its descendants may run on (what `move_process` set; for
    tests and benches)."""
    out = []
    for tid in sorted(_tree_threads(pid)):
        with contextlib.suppress(OSError):
            out.append(frozenset(os.sched_getaffinity(tid)))
    return out


# -- holding builds while a pair is timed ----------------------------------------------------------

class Holds:
    """The process groups that stop while any lane times (hold mode): builds, and children while they
    start. `window()` marks a timed window; windows of several lanes may overlap. `paused_s()` is the
    total time groups have been held so far, which the waits of held processes add to their deadlines."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self._windows = 0
        self._since = 0.0
        self._paused = 0.0

    def add(self, pgid: int) -> None:
        if not self.active:
            return
        with self._lock:
            self._groups.add(pgid)
            if self._windows:
                _signal_group(pgid, signal.SIGSTOP)

    def discard(self, pgid: int) -> None:
        if not self.active:
            return
        with self._lock:
            if pgid in self._groups:
                self._groups.discard(pgid)
                if self._windows:
                    _signal_group(pgid, signal.SIGCONT)

    def paused_s(self) -> float:
        with self._lock:
            return self._paused + (time.monotonic() - self._since if self._windows else 0.0)

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        if not self.active:
            yield
            return
        with self._lock:
            self._windows += 1
            if self._windows == 1:
                self._since = time.monotonic()
                for pgid in self._groups:
                    _signal_group(pgid, signal.SIGSTOP)
        try:
            yield
        finally:
            with self._lock:
                self._windows -= 1
                if self._windows == 0:
                    self._paused += time.monotonic() - self._since
                    for pgid in self._groups:
                        _signal_group(pgid, signal.SIGCONT)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@contextlib.contextmanager
def group_stopped(pgid: int | None) -> Iterator[None]:
    """The process group `pgid` (a child between its commands) stopped for the block (SIGSTOP, then
    SIGCONT however the block ends); None: nothing to stop."""
    if pgid is None:
        yield
        return
    _signal_group(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        _signal_group(pgid, signal.SIGCONT)


class Bystanders:
    """The candidate children that lanes of one device keep alive, by lane: while one lane's window is
    open (`stopped`), every other lane's are stopped (SIGSTOP to their process groups), so that a
    thread a candidate left launching work between its commands cannot land in another pair's timing.
    Between commands a child only waits for its next one: stopping it changes nothing else."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[int, set[int]] = {}  # lane -> process groups

    def add(self, lane: int, pgid: int) -> None:
        with self._lock:
            self._groups.setdefault(lane, set()).add(pgid)

    def discard(self, lane: int, pgid: int) -> None:
        with self._lock:
            self._groups.get(lane, set()).discard(pgid)

    @contextlib.contextmanager
    def stopped(self, lane: int) -> Iterator[None]:
        """The other lanes' children stopped for the block (the caller holds the device's gate alone)."""
        with self._lock:
            others = [g for owner, groups in self._groups.items() if owner != lane for g in groups]
        for pgid in others:
            _signal_group(pgid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pgid in others:
                _signal_group(pgid, signal.SIGCONT)


class Quiet:
    """A lane's quiet window: the device's gate held exclusively (nothing else of ours runs on the
    device while a pair is timed, its memory measured or its call times compared: `kbv.gate`) and, in
    hold mode, the builds stopped meanwhile. Lanes on one device share `gate`; the `Holds` are the
    machine's."""

    def __init__(self, gate: DeviceGate | None = None, holds: Holds | None = None,
                 bystanders: Bystanders | None = None, lane: int = 0) -> None:
        self.gate = gate or DeviceGate()
        self.bystanders = bystanders or Bystanders()  # the device's lanes' candidate children
        self.lane = lane
        self._holds = holds
        self._depth = 0  # changed only by the thread holding `gate` exclusively
        self._window: contextlib.ExitStack | None = None

    def __enter__(self) -> Quiet:
        self.gate.acquire_exclusive()
        self._depth += 1
        if self._depth == 1:
            window = contextlib.ExitStack()
            try:
                window.enter_context(self.bystanders.stopped(self.lane))
                if self._holds is not None:
                    window.enter_context(self._holds.window())
            except BaseException:
                window.close()
                self._depth -= 1
                self.gate.release_exclusive()
                raise
            self._window = window
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._depth -= 1
            if self._depth == 0 and self._window is not None:
                window, self._window = self._window, None
                window.close()
        finally:
            self.gate.release_exclusive()
