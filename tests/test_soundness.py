"""Problem soundness (`kbv problems check`): a problem that a trivial candidate would pass, whose
output ignores an input, or whose reference is not deterministic is flagged with the reason; the
bundled suite is clean; verdicts on a flagged problem carry the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kbv.api import EvalConfig, check_problems, evaluate
from kbv.cli import app
from kbv.verdict import Category

HEADER = "import torch\nimport torch.nn as nn\n"
INPUTS = """
def get_inputs():
    return [torch.rand(8, 64)]
def get_init_inputs():
    return []
"""
UNSOUND = {
    # the answer is the input: identity passes whatever the inputs are
    "1_Copy": "class Model(nn.Module):\n    def forward(self, x):\n        return x.clone()\n" + INPUTS,
    # the output ignores its input, and is all zero: no distribution calibrates
    "2_Zeroed": "class Model(nn.Module):\n    def forward(self, x):\n        return x * 0\n" + INPUTS,
    # the second input never matters
    "3_IgnoresSecond": "class Model(nn.Module):\n    def forward(self, x, y):\n        return torch.tanh(x) + 0 * y\n"
                       "def get_inputs():\n    return [torch.rand(8, 64), torch.rand(8, 64)]\n"
                       "def get_init_inputs():\n    return []\n",
    # dropout in training mode: two runs of the reference disagree
    "4_Noisy": "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.drop = nn.Dropout(0.5)\n    def forward(self, x):\n        return self.drop(x * 3)\n"
               + INPUTS,
}
EXPECTED = {
    "1_Copy": "identity passes on every distribution",
    "2_Zeroed": "no distribution is applicable",
    "3_IgnoresSecond": "the output does not depend on input 1",
    "4_Noisy": "nondeterministic reference",
}


@pytest.fixture(scope="module")
def unsound_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unsound") / "level1"
    root.mkdir()
    for name, body in UNSOUND.items():
        (root / f"{name}.py").write_text(HEADER + body)
    return root.parent


def test_each_unsound_problem_is_flagged_with_its_reason(unsound_dir):
    reports = {r.problem.split("/")[-1]: r for r in check_problems(str(unsound_dir), device="cpu", seed=5)}
    assert set(reports) == set(EXPECTED), list(reports)
    for name, reason in EXPECTED.items():
        report = reports[name]
        assert not report.sound, name
        assert any(reason in flag for flag in report.flags), (name, report.flags)


def test_the_bundled_suite_is_sound_and_notes_what_only_its_own_inputs_let_pass():
    reports = check_problems("smoke", device="cpu", seed=11)
    assert len(reports) >= 12
    assert [(r.problem, r.flags) for r in reports if not r.sound] == []
    relu = next(r for r in reports if r.problem.endswith("2_ReLU"))
    # ReLU's own inputs are non-negative, so the identity passes there and only there
    assert any(n.startswith("identity passes on default") and "only" in n for n in relu.notes), relu.notes


def test_problems_check_prints_the_unsound_table(unsound_dir):
    result = CliRunner().invoke(app, ["problems", "check", str(unsound_dir), "--device", "cpu", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert "4 of 4 problems unsound" in result.output
    assert "identity passes on every" in result.output


def test_verdicts_on_a_flagged_problem_carry_the_flag(unsound_dir, tmp_path):
    cand = tmp_path / "cands"
    cand.mkdir()
    (cand / "1_Copy.py").write_text(HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                    "        return x + 0.0\n")
    result = evaluate(EvalConfig(candidates=str(cand), problems=str(unsound_dir), protocol="verified",
                                 device="cpu", run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                                 seed=5, timer_budget_s=1.0, ci_target=0.1))
    (verdict,) = result.verdicts
    assert any("identity passes on every distribution" in f for f in verdict.flags), verdict.flags
    assert Category.UNSOUND_PROBLEM in verdict.categories


ARGMAX = HEADER + "class Model(nn.Module):\n    def forward(self, x):\n        return torch.argmax(x, dim=1)\n" + INPUTS
HUNGRY = HEADER + ("class Model(nn.Module):\n    def forward(self, x):\n"
                   "        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB')\n") + INPUTS


def test_an_integer_output_is_screened_and_sound(tmp_path):
    """Argmax: an int64 output of another shape than its input. Trivials that do not apply to it (the
    identity of a (8, 64) input) are skipped, not filled with NaN an integer cannot hold."""
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "51_Argmax.py").write_text(ARGMAX)
    [report] = check_problems(str(tmp_path), device="cpu", seed=5)
    assert report.sound, report.flags


def test_a_problem_too_large_for_the_device_says_so(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "9_Hungry.py").write_text(HUNGRY)
    [report] = check_problems(str(tmp_path), device="cpu", seed=5)
    assert len(report.flags) == 1 and report.flags[0].startswith("too large for this device"), report.flags
