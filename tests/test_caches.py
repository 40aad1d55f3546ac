"""Result caches and constant outputs (kbv.detect.caches): rules over the trials' fingerprints and the replay probe's times."""

from __future__ import annotations

from kbv.detect.caches import constant_output, replayed_output, replayed_timing
from kbv.verdict import Category

A, B = (1, 1), (2, 2)


def test_the_same_failing_output_for_every_input_is_a_constant():
    assert constant_output([(A, False), (A, False), (A, False)]) == (
        Category.VALUE_MISMATCH, "the same output for every input: it does not depend on its input")
    assert constant_output([(A, False), (B, False)]) is None


def test_trials_without_an_output_of_their_own_are_never_alike():
    """Trials whose output was never delivered (a wrong dtype) or showed the poison have no
    fingerprint: they compare with nothing, each other included."""
    assert constant_output([(None, False)] * 10) is None
    assert constant_output([(A, False), (None, False), (None, False)]) is None
    assert constant_output([(A, False), (None, False), (A, False)]) is not None
    assert replayed_output([(None, True), (None, False)]) is None


def test_a_failing_output_equal_to_an_earlier_passing_one_was_replayed():
    assert replayed_output([(A, True), (B, True), (A, False)]) == (
        Category.RESULT_CACHE, "trial 2 returned the output of an earlier trial with other inputs")
    assert replayed_output([(A, False), (A, False)]) is None


def test_a_second_call_fast_because_the_machine_is_warmer_is_no_replay():
    """A busy 2-core box: the first call after the harness's pause waits for the CPU, the next two
    (the same inputs, then fresh ones) do not. Seen on the honest C++ ReLU of `make demo`."""
    assert replayed_timing([(0.175, 0.035, 0.036), (0.180, 0.034, 0.035), (0.170, 0.036, 0.037)]) is None


def test_a_second_call_answered_without_computing_is_a_replay():
    found = replayed_timing([(0.175, 0.004, 0.170), (0.180, 0.004, 0.176), (0.170, 0.005, 0.171)])
    assert found is not None and found[0] is Category.RESULT_CACHE
    # a child that reports no fresh call is judged on the first two calls alone
    assert replayed_timing([(0.175, 0.004), (0.180, 0.004), (0.170, 0.005)]) is not None


class _ReplayChild:
    """A child that answers the replay probe with `pairs` (what a candidate's code could forge)."""

    def __init__(self, pairs):
        self.pairs, self.killed, self.calls = pairs, False, []

    def put(self, values, timeout_s):
        return list(values)

    def call(self, cmd, timeout_s):
        self.calls.append(cmd)
        return {"pairs": self.pairs}

    def kill(self):
        self.killed = True

    def evidence(self):
        return {}


def _replay(child):
    import time
    from types import SimpleNamespace

    import torch

    from kbv.protocols.verified.runner import VerifiedRunner

    runner = SimpleNamespace(settings=SimpleNamespace(device="cpu"))
    prepared = SimpleNamespace(draw=lambda k, purpose, device: [torch.full((4,), float(k))])
    return VerifiedRunner._replay_probe(runner, child, prepared, time.monotonic() + 60, None)


def test_the_replay_probe_hands_its_sets_a_probe_at_a_time_and_reads_a_cache():
    honest, cache = _ReplayChild([[1.0, 1.0, 1.0]]), _ReplayChild([[1.0, 0.01, 1.0]])
    assert _replay(honest) is None
    assert len(honest.calls) == 3 and all(len(c["sets"]) == len(c["fresh"]) == 1 for c in honest.calls)
    assert _replay(cache)[0] is Category.RESULT_CACHE


def test_a_forged_replay_reply_is_the_candidates_crash_never_the_runs():
    import pytest

    from kbv.sandbox import ChildFailure
    from kbv.verdict import Status

    for forged in (None, False, 0, [5], [["a", 1.0, 1.0]], [[float("nan"), 1.0, 1.0]], [[1.0] * 9]):
        child = _ReplayChild(forged)
        with pytest.raises(ChildFailure) as failure:
            _replay(child)
        assert failure.value.status is Status.CRASHED and child.killed
        assert "malformed replay reply" in failure.value.message
