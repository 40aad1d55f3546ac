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
