"""Where a pair's wall time goes: exclusive seconds per named stage, recorded into the verdict.

A `StageClock` is made per pair by the executor and made current for the thread that evaluates it;
code at any depth marks its work with `with stage("timing"):` and needs no clock passed down. Stages
nest; time is charged to the innermost one (copying a timed output across the boundary counts as
`boundary`, not `timing`). Outside a current clock, `stage` does nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

STAGES = ("child_start", "build_wait", "prepare", "load", "boundary", "correctness", "probes", "attribution",
          "timing", "memory")


class StageClock:
    """Exclusive wall seconds per stage of one pair. `exclusive` maps stage names to locks held while
    the stage runs (the executor's: nothing else of ours may start on the device while a pair is timed)."""

    def __init__(self, exclusive: dict[str, Any] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.exclusive = exclusive or {}
        self._stack: list[list[float | str]] = []  # [name, started, child seconds]
        self.detail = ""  # what the innermost stage is doing, for a glance (`note`): "truth 6/10"

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        lock = self.exclusive.get(name)
        with lock if lock is not None else contextlib.nullcontext():
            with self._timed(name):
                yield

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        entry: list[float | str] = [name, time.perf_counter(), 0.0]
        self._stack.append(entry)
        try:
            yield
        finally:
            self._stack.pop()
            self.detail = ""
            spent = time.perf_counter() - float(entry[1])
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - float(entry[2])
            if self._stack:
                self._stack[-1][2] = float(self._stack[-1][2]) + spent

    def now(self) -> tuple[str, float] | None:
        """The innermost stage running and its seconds so far (read from another thread: a glance)."""
        stack = list(self._stack)
        if not stack:
            return None
        name, started = stack[-1][0], float(stack[-1][1])
        detail = self.detail
        return (f"{name}: {detail}" if detail else str(name)), time.perf_counter() - started

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in sorted(self.seconds.items(), key=lambda kv: STAGES.index(kv[0])
                                                   if kv[0] in STAGES else len(STAGES))}


_CURRENT: contextvars.ContextVar[StageClock | None] = contextvars.ContextVar("kbv_stage_clock", default=None)


@contextlib.contextmanager
def measuring(clock: StageClock) -> Iterator[StageClock]:
    """Make `clock` the current thread's clock for the block."""
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Charge the block's wall time to `name` on the current clock (no-op without one)."""
    clock = _CURRENT.get()
    if clock is None:
        yield
        return
    with clock.stage(name):
        yield


def note(detail: str) -> None:
    """Say what the current stage is doing, for the run's heartbeat (`prepare: truth 6/10`); '' clears."""
    clock = _CURRENT.get()
    if clock is not None:
        clock.detail = detail
