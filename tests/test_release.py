"""A problem's prepared state gives its tensors back when the executor moves to the next problem,
even while something else still holds the record: on a GPU the parent shares the device with the
children of the next pairs, and a multi-GB problem's trials would otherwise starve them."""

from __future__ import annotations

from pathlib import Path

import torch

from kbv.problems import load_problem_file
from kbv.protocols.standard import StandardProtocol, StandardRunner, prepare_standard
from kbv.protocols.verified.prepare import prepare_trials
from kbv.protocols.verified.rules import VerifiedProtocol
from kbv.settings import Settings
from sources import RELU_PROBLEM


def _problem(tmp_path: Path):
    path = tmp_path / "level1" / "19_ReLU.py"
    path.parent.mkdir(parents=True)
    path.write_text(RELU_PROBLEM)
    return load_problem_file(path)


def test_a_released_standard_context_holds_no_tensors(tmp_path):
    ctx = prepare_standard(_problem(tmp_path), StandardProtocol(), torch.device("cpu"))
    assert ctx.trials and ctx.timing_inputs
    runner = StandardRunner(StandardProtocol(), Settings(device="cpu", run_dir=tmp_path / "run",
                                                         cache_dir=tmp_path / "cache"), None, "cpu")
    runner.release(ctx)
    assert ctx.trials == [] and ctx.timing_inputs == []


def test_a_closed_verified_problem_holds_no_tensors(tmp_path):
    prepared = prepare_trials(_problem(tmp_path), VerifiedProtocol(), torch.device("cpu"), b"\x01" * 16)
    assert all(t.keep for t in prepared.trials)  # a small problem keeps its trials between candidates
    prepared.trials[0].inputs  # noqa: B018 - made now
    prepared.pool = [[torch.zeros(4)]]
    prepared.close()
    assert prepared.pool == []
    assert all(t._data is None for t in prepared.trials)
