"""One device's gate: the untimed work of several pairs shares the device, a timed window has it alone.

Several lanes may evaluate pairs on one device at once (`--pairs-per-device`). What they do is of two
kinds. A timed window (timing, memory, the probes that compare call times) must see nothing else of
ours on the device; everything else (preparing a problem, loading a candidate, the correctness trials,
attribution, a child's device coming up) may overlap the same kind of work of another pair, since no
number depends on how long it takes. So each lane holds the gate *shared* for the whole of a pair and
takes it *exclusively* for a window:

- `shared()`: held by any number of threads at once; nests. A thread that holds the gate exclusively
  passes through.
- `exclusive()`: waits until no other thread holds the gate, and stops new shared holders meanwhile
  (a window is never starved by a stream of untimed work). The thread's own shared hold is given up
  while it waits and taken back after, so two lanes that both want a window never deadlock. Once
  inside, the device is synchronised (`synchronize`): device work the parent queued for another pair,
  asynchronously, ends before the window opens.
- `checkpoint()`: called between a pair's commands (`kbv.sandbox.Sandbox.call`): where a window waits,
  the shared hold is given up until it has closed, so a window waits for one command of the other pair,
  not for the rest of its stage.

The gate of the calling thread is found through a context variable (`holding`), set by the lane for
the pair it evaluates; code with no gate current (a test, a bench) runs as before. The seconds a
pair waits at the gate are its account (`waited_s`), which its deadline does not count.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol


class DeviceGate:
    """A reader-writer gate with writer preference; `synchronize` runs as each exclusive hold begins."""

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._synchronize = synchronize
        self._shared: dict[int, int] = {}  # thread id -> depth of its shared holds
        self._writer: int | None = None  # the thread holding it exclusively
        self._writer_depth = 0
        self._waiting = 0  # threads waiting for an exclusive hold
        self._parked: dict[int, int] = {}  # writer's thread id -> the shared depth it gave up to wait
        self._waited: dict[int, float] = {}  # thread id -> seconds it waited for the gate (`waited_s`)
        self.windows = 0  # exclusive holds granted so far (for tests and the run's figures)

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Wait (the condition's lock held) until `ready`; the seconds it took go to the thread's account."""
        if ready():
            return
        t0 = time.monotonic()
        self._cond.wait_for(ready)
        me = threading.get_ident()
        self._waited[me] = self._waited.get(me, 0.0) + time.monotonic() - t0

    def waited_s(self) -> float:
        """The seconds the calling thread has waited for this gate since `reset_waited`."""
        return self._waited.get(threading.get_ident(), 0.0)

    def reset_waited(self) -> None:
        self._waited.pop(threading.get_ident(), None)

    def book(self, seconds: float) -> None:
        """`seconds` the calling thread waited for another pair elsewhere (a lock of the process's), to its account."""
        me = threading.get_ident()
        with self._cond:
            self._waited[me] = self._waited.get(me, 0.0) + seconds

    # -- shared ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                passing = True
            else:
                passing = False
                if not self._shared.get(me):
                    self._wait(lambda: self._writer is None and not self._waiting)
                self._shared[me] = self._shared.get(me, 0) + 1
        try:
            yield
        finally:
            if not passing:
                with self._cond:
                    left = self._shared.get(me, 0) - 1
                    if left > 0:
                        self._shared[me] = left
                    else:
                        self._shared.pop(me, None)
                        self._cond.notify_all()

    def checkpoint(self) -> None:
        """Where a window waits and this thread holds the gate shared: let the window in first."""
        me = threading.get_ident()
        if not self._waiting or self._writer == me:  # a glance without the lock: the common case
            return
        with self._cond:
            depth = self._shared.pop(me, 0)
            if not depth:
                return
            self._cond.notify_all()
            self._wait(lambda: self._writer is None and not self._waiting)
            self._shared[me] = depth

    @contextlib.contextmanager
    def stepped_out(self) -> Iterator[None]:
        """This thread's shared hold given up for the block, and taken back after it (behind any window
        that waits): for a wait on another pair of the device (`kbv.room`), which may need a window of
        its own before it ends. The block's seconds go to the thread's account (`waited_s`)."""
        me = threading.get_ident()
        if self._writer == me:  # a window never waits on another pair
            yield
            return
        t0 = time.monotonic()
        with self._cond:
            depth = self._shared.pop(me, 0)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waited[me] = self._waited.get(me, 0.0) + time.monotonic() - t0
                if depth:
                    self._wait(lambda: self._writer is None and not self._waiting)
                    self._shared[me] = depth

    # -- exclusive ------------------------------------------------------------------------------------
    def acquire_exclusive(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writer_depth += 1
                return
            self._waiting += 1
            depth = self._shared.pop(me, 0)  # given up while waiting: another lane may want a window too
            self._cond.notify_all()
            try:
                self._wait(lambda: self._writer is None and not self._shared)
            finally:
                self._waiting -= 1
            self._writer, self._writer_depth = me, 1
            self._parked[me] = depth
            self.windows += 1
        if self._synchronize is not None:
            try:
                self._synchronize()
            except BaseException:  # a device fault: the window never opened, and the gate stays usable
                self.release_exclusive()
                raise

    def release_exclusive(self) -> None:
        me = threading.get_ident()
        with self._cond:
            assert self._writer == me, "released by a thread that does not hold the gate"
            self._writer_depth -= 1
            if self._writer_depth:
                return
            self._writer = None
            depth = self._parked.pop(me, 0)
            self._cond.notify_all()
            if depth:  # its shared hold back, after any window that waits (writer preference)
                self._wait(lambda: self._writer is None and not self._waiting)
                self._shared[me] = depth

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.acquire_exclusive()
        try:
            yield
        finally:
            self.release_exclusive()


class Lock(Protocol):
    """A lock of the process's (`threading.Lock`, `threading.RLock`)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


_CURRENT: contextvars.ContextVar[DeviceGate | None] = contextvars.ContextVar("kbv_device_gate", default=None)


@contextlib.contextmanager
def holding(gate: DeviceGate) -> Iterator[None]:
    """Hold `gate` shared for the block, and make it the current thread's (for `checkpoint`)."""
    token = _CURRENT.set(gate)
    gate.reset_waited()
    try:
        with gate.shared():
            yield
    finally:
        _CURRENT.reset(token)


def waited_s() -> float:
    """The seconds the current pair has waited for other pairs' windows (0 with no gate current): a
    pair's deadline moves on by them (`kbv.settings.time_left`)."""
    gate = _CURRENT.get()
    return gate.waited_s() if gate is not None else 0.0


@contextlib.contextmanager
def taken(lock: Lock) -> Iterator[None]:
    """`lock` (one of the process's, shared by the lanes: `kbv.inputs.rng_isolated`) held for the block.
    A wait for it is a wait for another pair, so its seconds go to the current pair's account
    (`waited_s`): they neither count against its deadlines nor hide in its own figures."""
    if not lock.acquire(blocking=False):
        t0 = time.monotonic()
        lock.acquire()
        gate = _CURRENT.get()
        if gate is not None:
            gate.book(time.monotonic() - t0)
    try:
        yield
    finally:
        lock.release()


def checkpoint() -> None:
    """Between two commands of a pair: give a waiting window of another pair the device first."""
    gate = _CURRENT.get()
    if gate is not None:
        gate.checkpoint()


@contextlib.contextmanager
def stepped_out() -> Iterator[None]:
    """The current gate's shared hold given up for the block (`DeviceGate.stepped_out`); none: nothing."""
    gate = _CURRENT.get()
    if gate is None:
        yield
        return
    with gate.stepped_out():
        yield


def synchronizer(device: str) -> Callable[[], None] | None:
    """What opens a window on `device` in the parent: a CUDA device's synchronise (the parent's queued
    work for other pairs ends first); nothing on a CPU, where the parent's work is done when it returns."""
    if not device.startswith("cuda"):
        return None

    def synchronize() -> None:
        import torch

        torch.cuda.synchronize(torch.device(device))

    return synchronize
