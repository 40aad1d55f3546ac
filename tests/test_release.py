"""A problem's prepared state gives its tensors back when the executor moves to the next problem,
even while something else still holds the record: on a GPU the parent shares the device with the
children of the next pairs, and a multi-GB problem's trials would otherwise starve them."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from kbv.candidates import Candidate, Pair
from kbv.errors import ProblemRunError
from kbv.executors import Job
from kbv.executors.local import LocalExecutor
from kbv.problems import load_problem_file
from kbv.protocols.standard import StandardProtocol, StandardRunner, prepare_standard
from kbv.protocols.verified.prepare import prepare_trials
from kbv.protocols.verified.rules import VerifiedProtocol
from kbv.settings import Settings
from sources import HONEST_RELU, RELU_PROBLEM


def _problem(tmp_path: Path):
    path = tmp_path / "level1" / "19_ReLU.py"
    path.parent.mkdir(parents=True)
    path.write_text(RELU_PROBLEM)
    return load_problem_file(path)


def test_a_released_standard_context_holds_no_tensors(tmp_path):
    ctx = prepare_standard(_problem(tmp_path), StandardProtocol(), torch.device("cpu"))
    assert ctx.trials and ctx.timing_inputs
    runner = StandardRunner(StandardProtocol(), Settings(device="cpu", run_dir=tmp_path / "run",
                                                         cache_dir=tmp_path / "cache"))
    closed = []
    ctx.stack.callback(closed.append, "the baseline's child")
    runner.release(ctx)
    assert ctx.trials == [] and ctx.timing_inputs == []
    assert closed == ["the baseline's child"] and ctx.baseline is None


def test_a_closed_verified_problem_holds_no_tensors(tmp_path):
    prepared = prepare_trials(_problem(tmp_path), VerifiedProtocol(), torch.device("cpu"), b"\x01" * 16)
    assert all(t.keep for t in prepared.trials)  # a small problem keeps its trials between candidates
    prepared.trials[0].inputs  # noqa: B018 - made now
    prepared.pool = [[torch.zeros(4)]]
    prepared.close()
    assert prepared.pool == []
    assert all(t._data is None for t in prepared.trials)


class _OutOfMemoryRunner:
    """A protocol whose preparation runs the device out of memory halfway, holding a tensor."""

    name = "verified"

    def __init__(self, message: str) -> None:
        self.held: list[weakref.ref[torch.Tensor]] = []
        self.prepares = 0
        self.message = message

    def prepare(self, pair: Pair) -> None:
        self.prepares += 1
        half_made = torch.zeros(1 << 20)
        self.held.append(weakref.ref(half_made))
        raise torch.OutOfMemoryError(self.message)

    def release(self, context: object) -> None:  # pragma: no cover - nothing is ever prepared
        raise AssertionError("nothing was prepared")

    def blank(self, pair: Pair):  # pragma: no cover - no verdict is made
        raise AssertionError("no verdict is made")


@pytest.mark.parametrize("message", ["CUDA out of memory. Tried to allocate 2.62 GiB.", ""])
def test_a_problem_too_large_for_the_device_fails_that_problem_and_keeps_nothing(tmp_path, message):
    problem = _problem(tmp_path)
    cand = Candidate(code=HONEST_RELU, name="19_ReLU__honest", origin="c.py", problem_ref="19_ReLU")
    runner = _OutOfMemoryRunner(message)
    executor = LocalExecutor(Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache"),
                             {"verified": runner})
    try:
        futures = [executor.submit(Job(Pair(problem, cand), "verified", f"k{i}")) for i in range(2)]
        errors = [fut.exception(timeout=120) for fut in futures]
    finally:
        executor.close()
    # a problem failure (the run goes on to other problems), named, in one line; prepared once
    assert all(isinstance(e, ProblemRunError) for e in errors)
    assert "too large for cpu under the verified protocol" in str(errors[0]) and "\n" not in str(errors[0])
    assert runner.prepares == 1
    gc.collect()
    assert [ref() for ref in runner.held] == [None]  # the half-made problem's tensors are gone
