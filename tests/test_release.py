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
    assert all(not t.made for t in prepared.trials)


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


def test_a_problem_too_large_for_the_host_is_refused_with_its_figures_before_anything_is_allocated(tmp_path):
    """KernelBench's L1/19_ReLU (6.4 GB of input) on a 24 GiB box took kbv's own process to 23.5 GB
    and the out-of-memory killer. Here a 256 GiB ReLU: its footprint, traced on the meta device, is
    refused under both protocols as a stored problem failure with the figures; kbv's memory stays put."""
    import resource

    from kbv.api import EvalConfig, evaluate
    from kbv.store import open_store
    from sources import write_tree

    huge = RELU_PROBLEM.replace("torch.randn(16, 256)", "torch.randn(1 << 20, 1 << 16)")
    problems = write_tree(tmp_path / "problems", {"level1/19_ReLU.py": huge})
    cands = write_tree(tmp_path / "cands", {"19_ReLU__honest.py": HONEST_RELU})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(problems), protocol="both", device="cpu",
                                 run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache")))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < (512 << 10)  # KiB: under 512 MiB
    assert result.verdicts == () and result.problem_failures
    message = result.problem_failures[0].message
    assert "too large for this machine under the standard protocol" in message
    assert "GiB of host memory" in message and "free" in message and "256 GiB of inputs" in message
    with open_store(tmp_path / "run", create=False) as store:
        stored = {f.protocol: f.message for f in store.problem_failures()}
    assert set(stored) == {"standard", "verified"}
    assert "under the verified protocol" in stored["verified"] and "float64 truth" in stored["verified"]
