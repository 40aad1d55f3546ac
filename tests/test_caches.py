"""Result caches and constant outputs (kbv.detect.caches): rules over the trials' fingerprints."""

from __future__ import annotations

from kbv.detect.caches import constant_output, replayed_output
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
