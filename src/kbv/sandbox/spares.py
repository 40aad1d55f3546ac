"""Reference children started ahead. A problem's preparation needs children that load no candidate
code (the baselines it times); spawning one costs its interpreter, torch's import and its device coming
up, seconds that were most of a small problem's preparation. A lane keeps a few such children started
and ready (`kbv.executors.local`), made current for the pair it evaluates (`offering`); `reference_child`
takes one where there is one, and spawns one otherwise (a lane that keeps none, Ray's workers, a test).

A spare is any reference child: it holds nothing of a problem until it is sent the reference's code.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING

from kbv.sandbox.parent import Sandbox

if TYPE_CHECKING:
    from kbv.settings import Settings

# a started, ready reference child and the stack that closes it, or None when none is ready now
Take = Callable[[], "tuple[ExitStack, Sandbox] | None"]

_CURRENT: contextvars.ContextVar[Take | None] = contextvars.ContextVar("kbv_spare_children", default=None)


@contextlib.contextmanager
def offering(take: Take) -> Iterator[None]:
    """Make `take` the source of reference children for the block (the lane's thread, one pair)."""
    token = _CURRENT.set(take)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def reference_child(settings: Settings, label: str, stack: ExitStack) -> Sandbox:
    """A child for reference code, closed with `stack`: a spare one, up and ready, where the lane has
    one; else one spawned now (its start-up still to come: `Sandbox.ready` waits for it)."""
    take = _CURRENT.get()
    taken = take() if take is not None else None
    if taken is not None:
        child_stack, sandbox = taken
        stack.enter_context(child_stack)
        return sandbox
    spec = stack.enter_context(settings.child_scratch(label))
    return stack.enter_context(Sandbox(spec))
