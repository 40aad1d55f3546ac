"""The candidate's own launches as the guards count them (kbv.sandbox.guards): an extension's function
is counted outside timed loops, goes uncounted (and unclocked) inside them, and is suppressed in a
ghost replay either way; its counting wrapper is made once, not on every call."""

from __future__ import annotations

import types

import pytest

from kbv.sandbox.guards import GhostCall, Guards, _CountingModule


def _extension() -> tuple[_CountingModule, Guards, list[int]]:
    calls: list[int] = []
    module = types.ModuleType("relu_ext")
    module.forward = lambda x: calls.append(x) or x  # type: ignore[attr-defined]
    guards = Guards([])
    return _CountingModule(module, guards), guards, calls


def test_calls_are_counted_outside_a_timed_loop_and_not_inside_one():
    ext, guards, calls = _extension()
    ext.forward(1)
    ext.forward(2)
    assert guards.launches == {"ext:relu_ext.forward": 2} and guards.launch_s["ext:relu_ext.forward"] >= 0
    guards.timed = True
    for i in range(5):
        assert ext.forward(i) == i
    guards.timed = False
    assert guards.launches == {"ext:relu_ext.forward": 2} and len(calls) == 7
    ext.forward(3)
    assert guards.launches == {"ext:relu_ext.forward": 3}


def test_a_ghost_replay_suppresses_a_launch_even_inside_a_timed_loop():
    ext, guards, calls = _extension()
    guards.ghost, guards.timed = True, True
    with pytest.raises(GhostCall):
        ext.forward(1)
    assert calls == []


def test_the_wrapper_is_made_once_and_a_rebound_function_is_wrapped_anew():
    ext, guards, calls = _extension()
    first = ext.forward
    assert ext.forward is first  # found on the object: no new wrapper a call
    ext.forward = lambda x: -x  # the candidate rebinds its extension's function
    assert ext.forward is not first and ext.forward(4) == -4
    assert guards.launches == {"ext:relu_ext.forward": 1}
    del ext.forward
    with pytest.raises(AttributeError):
        ext.forward  # noqa: B018


def test_a_triton_launch_is_counted_outside_a_timed_loop_and_suppressed_in_a_ghost_replay():
    guards = Guards([])
    launched: list[int] = []

    def kernel_fn():  # the @triton.jit function a JITFunction holds
        pass

    run = guards._counting_run(lambda kernel, *args: launched.append(1) or "launched")
    kernel = types.SimpleNamespace(fn=kernel_fn)
    assert run(kernel) == "launched" and guards.launches == {"triton:kernel_fn": 1}
    guards.timed = True
    assert run(kernel) == "launched" and guards.launches == {"triton:kernel_fn": 1} and len(launched) == 2
    guards.ghost = True  # a ghost replay is never skipped, timed or not
    assert run(kernel) is None and guards.launches == {"triton:kernel_fn": 2} and len(launched) == 2
