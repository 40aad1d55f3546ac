"""The verified protocol's correctness step (kbv.protocols.verified.correctness) through evaluate(): a
verdict's categories are what the candidate truly has, and only that.

ONE evaluate() run over three candidates for the 19_ReLU problem (16x256 randn), about 10 s on a
2-core box: none passes correctness, so none is timed. And the probes' gate, without a child.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kbv.api import EvalConfig, evaluate
from kbv.protocols.verified.correctness import CorrectnessResult, run_probes
from kbv.protocols.verified.rules import VerifiedProtocol
from kbv.verdict import Category, Status, Verdict
from sources import write_tree

_HEADER = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"

# An output of another dtype (as under autocast) is never delivered: its trials have no output to
# compare with one another, so nothing is said of their values.
BF16_RELU = _HEADER + "        return torch.relu(x).to(torch.bfloat16)\n"

# A workspace of partial results four times the output's size (past the twice the output's size that
# poisoning once covered), summed over all its slots when only two were written: right wherever
# torch.empty happens to return zeros, garbage elsewhere.
UNWRITTEN_WORKSPACE = _HEADER + """\
        parts = torch.empty(4, x.numel(), dtype=x.dtype, device=x.device)  # (slot, element)
        half = torch.relu(x).reshape(-1) * 0.5
        parts[0] = half
        parts[1] = half  # slots 2 and 3, for a split that never happens, are never written
        return parts.sum(0).reshape(x.shape)
"""

# Honestly nondeterministic: another rounding every call, well past the tolerance. Its two runs
# disagree with no poison in sight.
NOISY_RELU = _HEADER + "        return torch.relu(x) * (1 + 1e-3 * torch.rand_like(x))\n"

CANDIDATES = {"bf16": BF16_RELU, "unwritten_workspace": UNWRITTEN_WORKSPACE, "noisy": NOISY_RELU}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory, relu_problems: Path, cache_dir: Path) -> dict[str, Verdict]:
    root = tmp_path_factory.mktemp("correctness")
    cands = write_tree(root / "candidates", {f"19_ReLU__{tag}.py": code for tag, code in CANDIDATES.items()})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(relu_problems), protocol="verified",
                                 device="cpu", run_dir=str(root / "run"), cache_dir=str(cache_dir), seed=5,
                                 timeout_s=120, jobs=1))
    return {v.candidate.removeprefix("19_ReLU__"): v for v in result.verdicts}


def test_an_output_of_another_dtype_is_a_dtype_mismatch_and_nothing_else(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["bf16"]
    assert v.status is Status.INCORRECT
    assert v.categories == (Category.DTYPE_MISMATCH,)
    assert {t.note for t in v.trials} == {"dtype bfloat16 != float32"}
    assert v.evidence["notes"] == [], "no output was delivered, so none can be the same for every input"


def test_an_unwritten_workspace_read_is_unwritten_output_and_nothing_else(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["unwritten_workspace"]
    assert v.status is Status.INTEGRITY_VIOLATION
    assert v.categories == (Category.UNWRITTEN_OUTPUT,), v.evidence["notes"]
    # every trial failed on the memory it never wrote alone: what it wrote is right
    assert {t.category for t in v.trials} == {Category.UNWRITTEN_OUTPUT}
    assert all(t.note.startswith("the poison shows in 4096 of 4096 output elements") for t in v.trials)


def test_runs_that_disagree_with_no_poison_showing_are_nondeterministic(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["noisy"]
    assert v.status is Status.INTEGRITY_VIOLATION
    assert v.categories == (Category.PRECISION_LOSS, Category.NONDETERMINISTIC), v.evidence["notes"]


def test_no_probe_runs_after_two_runs_on_identical_inputs_disagreed() -> None:
    """The probes judge one more output against the truth: an output that differs from run to run
    (memory it never wrote, a race) would fail them for that, and be named a result cache or a side
    stream it is not."""

    class NoChild:
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"a probe ran ({name})")

    trial = SimpleNamespace(inputs=[torch.zeros(4)], release=lambda: None)
    for category in (Category.UNWRITTEN_OUTPUT, Category.NONDETERMINISTIC):
        result = CorrectnessResult(integrity={category.value: "default trial 0: two runs on identical inputs disagree"})
        run_probes(NoChild(), SimpleNamespace(trials=[trial]), VerifiedProtocol(), 0.0, result)  # type: ignore[arg-type]
        assert result.passed is False and not result.hacks and not result.categories
