"""The verified protocol's correctness step (kbv.protocols.verified.correctness) through evaluate(): a
verdict's categories are what the candidate truly has, and only that.

ONE evaluate() run over three candidates for the 19_ReLU problem (16x256 randn), about 10 s on a
2-core box, and one over two for a small L2/27 (Conv3d, HardSwish, ReLU, Softmax, mean): none passes
correctness, so none is timed. And, without a child, the probes' gate and the precision_loss rule.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kbv.api import EvalConfig, evaluate
from kbv.compare import ErrorMeasure, Judgement
from kbv.protocols.verified.correctness import CorrectnessResult, _failure_category, run_probes
from kbv.protocols.verified.rules import PRECISION_LOSS_BELOW, VerifiedProtocol
from kbv.reference import Reference
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


# KernelBench's L2/27 at batch 2 (its own depth, height and width: a mean over fewer positions errs
# more without its ReLU, and every trial's error would pass 1e-2, old rule or new).
CONV_SOFTMAX_PROBLEM = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.hardswish(x)
        x = torch.relu(x)
        x = torch.softmax(x, dim=1)
        return torch.mean(x, dim=[2, 3, 4])


def get_inputs():
    return [torch.randn(2, 3, 16, 32, 32)]


def get_init_inputs():
    return [3, 16, 3]
"""

_CONV_HEADER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
"""

# What an RL-generated L2/27 kernel ran (its extension never built, so its PyTorch fallback did): no
# ReLU. All fp32: another function, erring about 1e-2, on some trials below it.
SKIPS_RELU = _CONV_HEADER + """\
        return F.softmax(F.hardswish(self.conv(x)), dim=1).mean(dim=[2, 3, 4])
"""

# The same function in bfloat16 throughout, its mean a bf16 sum then a division: rounding, and nothing else.
BF16_THROUGHOUT = _CONV_HEADER + """\
        y = F.conv3d(x.bfloat16(), self.conv.weight.bfloat16(), self.conv.bias.bfloat16())
        y = torch.softmax(torch.relu(F.hardswish(y)), dim=1)
        return (y.sum(dim=[2, 3, 4]) / y[0, 0].numel()).float()
"""


@pytest.fixture(scope="module")
def conv_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[str, Verdict]:
    root = tmp_path_factory.mktemp("correctness-conv")
    name = "27_Conv3d_HardSwish_ReLU_Softmax_Mean"
    problems = write_tree(root / "problems", {f"level2/{name}.py": CONV_SOFTMAX_PROBLEM})
    cands = write_tree(root / "candidates", {f"{name}__skips_relu.py": SKIPS_RELU,
                                             f"{name}__bf16.py": BF16_THROUGHOUT})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(problems), protocol="verified",
                                 device="cpu", run_dir=str(root / "run"), cache_dir=str(cache_dir), seed=5,
                                 timeout_s=120, jobs=1))
    return {v.candidate.removeprefix(f"{name}__"): v for v in result.verdicts}


def test_another_function_erring_under_one_percent_is_a_value_mismatch(conv_verdicts: dict[str, Verdict]) -> None:
    """Skipping the ReLU errs ~1e-2, some trials below it, where bf16 math of the reference errs ~2e-3:
    a wrong function, not precision lost (the old rule, any failing error under 1e-2, said
    `value_mismatch, precision_loss`)."""
    v = conv_verdicts["skips_relu"]
    assert v.status is Status.INCORRECT
    failed = [t for t in v.trials if not t.passed]
    assert any(t.candidate_err is not None and t.candidate_err < 1e-2 for t in failed), [t.note for t in failed]
    assert Category.VALUE_MISMATCH in v.categories and Category.PRECISION_LOSS not in v.categories, v.categories
    assert {t.category for t in failed} == {Category.VALUE_MISMATCH}
    assert all("the reference in bfloat16 errs" in t.note for t in failed)


def test_the_function_in_bfloat16_is_precision_loss(conv_verdicts: dict[str, Verdict]) -> None:
    v = conv_verdicts["bf16"]
    assert v.status is Status.INCORRECT
    assert v.categories == (Category.PRECISION_LOSS,), [t.note for t in v.trials]


def test_only_the_failing_outputs_are_held_to_the_reference_in_bfloat16() -> None:
    """Every failing output within PRECISION_LOSS_FACTOR (3) x the bf16 reference's error on it, in
    both measures, is precision_loss, however large (bf16 math of a softmax over large inputs errs past
    1e-2); one past it is value_mismatch. A passing output is not held to it: one exact in bf16 (an
    index, a count) errs more than 3 x nothing and still passes."""
    tiny, exact = ErrorMeasure(1e-7, 1e-7, True), ErrorMeasure(0.0, 0.0, True)

    def category(failing: ErrorMeasure, bf16: float = 2e-3) -> Category:
        j = Judgement(False, failing, tiny, tiny, (tiny, failing), (1,))
        return _failure_category(j, [exact, ErrorMeasure(bf16, bf16, True)])

    assert category(ErrorMeasure(5e-3, 6e-3, True)) is Category.PRECISION_LOSS
    assert category(ErrorMeasure(5e-3, 7e-3, True)) is Category.VALUE_MISMATCH  # elementwise 3.5x
    assert category(ErrorMeasure(7e-3, 5e-3, True)) is Category.VALUE_MISMATCH  # normwise 3.5x
    assert category(ErrorMeasure(3e-2, 3e-2, True), bf16=2e-2) is Category.PRECISION_LOSS


def test_a_reference_without_bfloat16_falls_back_to_the_absolute_bound() -> None:
    """linalg.inv has no bfloat16 kernel (on any device): no figure to hold the candidate to, so a
    failing error under PRECISION_LOSS_BELOW normwise is precision_loss, one above it value_mismatch."""

    class Inverse(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.linalg.inv(a)

    reference = Reference(SimpleNamespace(Model=Inverse), [], torch.device("cpu"), "tf32")  # type: ignore[arg-type]
    a = 2 * torch.eye(8) + 0.1 * torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    truth, _ = reference.truth(reference.build(0), [a])
    assert reference.bf16_errors(reference.build(0), [a], truth) is None
    tiny = ErrorMeasure(1e-7, 1e-7, True)
    for norm, expected in ((0.5 * PRECISION_LOSS_BELOW, Category.PRECISION_LOSS),
                           (2 * PRECISION_LOSS_BELOW, Category.VALUE_MISMATCH)):
        err = ErrorMeasure(norm, norm, True)
        assert _failure_category(Judgement(False, err, tiny, tiny, (err,), (0,)), None) is expected


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
