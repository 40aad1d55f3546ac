"""Problem soundness (`kbv problems check`): a problem that a trivial candidate would pass, whose
output ignores an input, or whose reference is not deterministic is flagged with the reason; the
bundled suite is clean; verdicts on a flagged problem carry the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kbv.api import EvalConfig, check_problems, evaluate, load_report
from kbv.cli import app
from kbv.verdict import Category, Status
from sources import write_tree

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
    # a recurrent cell that keeps its hidden state in a plain attribute, replaced by every call (as
    # KernelBench's VanillaRNN does): fresh models agree, but one model's second call differs
    "5_Stateful": "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                  "        self.cell = nn.Linear(128, 64)\n        self.hidden = torch.randn(8, 64)\n"
                  "    def forward(self, x):\n        self.hidden = torch.tanh(self.cell(torch.cat((x, self.hidden), 1)))\n"
                  "        return self.hidden\n" + INPUTS,
}
EXPECTED = {
    "1_Copy": "identity passes on every distribution",
    "2_Zeroed": "no input distribution applies",
    "3_IgnoresSecond": "the output does not depend on input 1",
    "4_Noisy": "nondeterministic reference",
    "5_Stateful": "stateful reference",
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
    assert "5 of 5 problems unsound" in result.output
    assert "identity passes on every" in result.output


def test_a_problem_an_answer_passes_everywhere_is_unsound_for_every_candidate(unsound_dir, tmp_path):
    cand = tmp_path / "cands"
    cand.mkdir()
    (cand / "1_Copy.py").write_text(HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                    "        return x + 0.0\n")
    result = evaluate(EvalConfig(candidates=str(cand), problems=str(unsound_dir), protocol="verified",
                                 device="cpu", run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                                 seed=5, timer_budget_s=1.0, ci_target=0.1))
    (verdict,) = result.verdicts
    assert any("identity passes on every distribution" in f for f in verdict.flags), verdict.flags
    # an answer that passes everywhere judges nothing: never `verified`, whatever the candidate did
    assert verdict.status is Status.UNSOUND_PROBLEM and verdict.speedup is None, (verdict.status, verdict.message)
    assert "identity passes on every distribution" in verdict.message
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


BROKEN = HEADER + ("class Model(nn.Module):\n    def forward(self, x):\n        return torch.tanh(x)\n"
                   "def get_inputs():\n    raise ValueError('the data file is missing')\n"
                   "def get_init_inputs():\n    return []\n")


def test_an_unjudgeable_problem_gets_a_stored_unsound_verdict_and_a_failed_problem_is_stored(unsound_dir, tmp_path):
    """No distribution applies (an all-zero output) or the reference is random (dropout): the verified
    protocol can judge no candidate, so each gets a verdict of its own status, stored and reported in
    every format, counted as not verified, and resumed like any other. A problem whose own code
    fails has no verdict, but the failure is stored and `kbv report` shows it."""
    problems = tmp_path / "problems" / "level1"
    problems.mkdir(parents=True)
    for name in ("2_Zeroed", "4_Noisy"):
        (problems / f"{name}.py").write_text((unsound_dir / "level1" / f"{name}.py").read_text())
    (problems / "5_Broken.py").write_text(BROKEN)
    cands = tmp_path / "cands"
    cands.mkdir()
    for name in ("2_Zeroed", "4_Noisy", "5_Broken"):
        (cands / f"{name}__mine.py").write_text(HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                                "        return x * 0 + 0.0\n")
    # a reply with no code: its verdict needs no problem, and must not clear the other pair's failure
    (cands / "5_Broken__empty.py").write_text("# the model wrote nothing\n")
    run = tmp_path / "run"
    config = EvalConfig(candidates=str(cands), problems=str(problems.parent), protocol="both", device="cpu",
                        run_dir=str(run), cache_dir=str(tmp_path / "cache"), seed=5, timer_budget_s=1.0, ci_target=0.1)
    result = evaluate(config)
    verified = {v.problem: v for v in result.verdicts if v.protocol == "verified" and v.status is not Status.NO_CODE}
    assert set(verified) == {"L1/2_Zeroed", "L1/4_Noisy"}
    assert [f.problem for f in result.problem_failures] == ["L1/5_Broken"]
    zeroed, noisy = verified["L1/2_Zeroed"], verified["L1/4_Noisy"]
    assert zeroed.status is Status.UNSOUND_PROBLEM and noisy.status is Status.UNSOUND_PROBLEM
    assert "no input distribution applies" in zeroed.message and "reference output all zero" in zeroed.message
    assert "nondeterministic reference" in noisy.message
    assert zeroed.speedup is None and noisy.speedup is None
    assert Category.UNSOUND_PROBLEM in zeroed.categories and Category.UNSOUND_PROBLEM in noisy.categories
    assert {v.problem for v in result.verdicts if v.protocol == "standard" and v.status is not Status.NO_CODE} == {
        "L1/2_Zeroed", "L1/4_Noisy"}

    report = load_report(run)
    verified_metrics = report.metrics["verified"]["all"]
    assert verified_metrics.pairs == 3 and verified_metrics.passed == 0 and verified_metrics.correct_rate == 0.0
    assert verified_metrics.statuses == {"unsound_problem": 2, "no_code": 1}
    assert sorted((f.problem, f.protocol, f.pairs) for f in report.problem_failures) == [
        ("L1/5_Broken", "standard", 1), ("L1/5_Broken", "verified", 1)]
    assert "the data file is missing" in report.problem_failures[0].message
    assert {v.status for v in report.verdicts if v.problem == "L1/5_Broken"} == {Status.NO_CODE}

    runner = CliRunner()
    table = runner.invoke(app, ["report", str(run)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert table.output.count("unsound_problem") >= 2 and "Problem failures" in table.output
    assert "the data file is missing" in table.output
    as_json = json.loads(runner.invoke(app, ["report", str(run), "--format", "json"]).output)
    assert sorted(v["status"] for v in as_json["verdicts"] if v["protocol"] == "verified") == [
        "no_code", "unsound_problem", "unsound_problem"]
    assert {f["problem"] for f in as_json["problem_failures"]} == {"L1/5_Broken"}
    lines = runner.invoke(app, ["report", str(run), "--format", "jsonl"]).output.splitlines()
    assert sum(json.loads(line)["status"] == "unsound_problem" for line in lines) == 2
    html = runner.invoke(app, ["report", str(run), "--format", "html", "--out", str(tmp_path / "r.html")])
    assert html.exit_code == 0, html.output
    page = (tmp_path / "r.html").read_text()
    assert page.count("status-unsound_problem") == 2 and 'id="problem-failures"' in page

    again = evaluate(config)  # the unsound verdicts are resumed; the failed problem is tried again
    assert again.resumed == 6 and again.evaluated == 0 and len(again.problem_failures) == 1
    assert len(load_report(run).problem_failures) == 2  # still standing


# KernelBench's L2/23 shape: Conv3d, GroupNorm, the mean over everything but the batch. Under the
# default init (GroupNorm's affine 1 and 0) the output is mean(bias) = 0 up to rounding, whatever the
# input; with the affine parameters drawn per trial it depends on the input through the weight.
GROUPNORM_MEAN = HEADER + """
class Model(nn.Module):
    def __init__(self, c_in, c_out, k, groups):
        super().__init__()
        self.conv = nn.Conv3d(c_in, c_out, k)
        self.group_norm = nn.GroupNorm(groups, c_out)
    def forward(self, x):
        return self.group_norm(self.conv(x)).mean(dim=[1, 2, 3, 4])
def get_inputs():
    return [torch.rand(4, 3, 6, 6, 6)]
def get_init_inputs():
    return [3, 8, 3, 4]
"""
# the public hack's shape: never reads its input, averages GroupNorm's bias and broadcasts it
BIAS_MEAN = HEADER + """
class ModelNew(nn.Module):
    def __init__(self, c_in, c_out, k, groups):
        super().__init__()
        self.conv = nn.Conv3d(c_in, c_out, k)
        self.group_norm = nn.GroupNorm(groups, c_out)
    def forward(self, x):
        return self.group_norm.bias.mean().expand(x.shape[0]).contiguous()
"""
# the same answer under other names: its parameters are not the reference's, so nothing is loaded
HARD_ZEROS = HEADER + """
class ModelNew(nn.Module):
    def __init__(self, c_in, c_out, k, groups):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(c_out))
    def forward(self, x):
        return torch.zeros(x.shape[0], device=x.device) + self.shift.mean() * 0
"""
# honest, with its modules under other names: built under the same seed, it draws the same values
RENAMED = HEADER + """
class ModelNew(nn.Module):
    def __init__(self, c_in, c_out, k, groups):
        super().__init__()
        self.c = nn.Conv3d(c_in, c_out, k)
        self.gn = nn.GroupNorm(groups, c_out)
    def forward(self, x):
        return self.gn(self.c(x)).mean(dim=[1, 2, 3, 4])
"""


def _evaluate_one(tmp_path, problem: str, name: str, candidates: dict[str, str], device: str = "cpu", **config):
    write_tree(tmp_path / "problems", {f"level2/{name}.py": problem})
    cands = write_tree(tmp_path / "cands", {f"{name}__{label}.py": code for label, code in candidates.items()})
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(tmp_path / "problems"), protocol="verified",
                                 device=device, run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                                 seed=5, timer_budget_s=1.0, ci_target=0.1, **config))
    return {v.candidate.split("__")[-1]: v for v in result.verdicts}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_kernel_that_hard_codes_the_default_init_is_incorrect_once_parameters_are_drawn(tmp_path, device):
    """GroupNorm's affine parameters are drawn per trial, in the reference and the candidate alike: the
    bias-mean answer and the zeros answer are incorrect, the honest model verified up to its (absent)
    custom kernel, also under other names. On CUDA the convolution's TF32 allowance applies too."""
    got = _evaluate_one(tmp_path, GROUPNORM_MEAN, "23_Conv3d_GroupNorm_Mean",
                        {"bias_mean": BIAS_MEAN, "zeros": HARD_ZEROS, "renamed": RENAMED}, device=device)
    for hack in ("bias_mean", "zeros"):
        assert got[hack].status is Status.INCORRECT, (hack, got[hack].status, got[hack].message)
        assert Category.VALUE_MISMATCH in got[hack].categories, got[hack].categories
        assert Category.UNSOUND_PROBLEM not in got[hack].categories
    honest = got["renamed"]
    assert honest.status is Status.NO_CUSTOM_KERNEL, (honest.status, honest.message)
    assert not honest.flags and Category.UNSOUND_PROBLEM not in honest.categories


def test_the_drawn_parameters_make_the_groupnorm_mean_problem_sound(tmp_path):
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "23_Conv3d_GroupNorm_Mean.py").write_text(GROUPNORM_MEAN)
    [report] = check_problems(str(tmp_path), device="cpu", seed=5)
    assert report.sound, report.flags


NORM_MEAN = HEADER + """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, 16, affine=False)
    def forward(self, x):
        return self.norm(x).mean(dim=[1, 2])
def get_inputs():
    return [torch.rand(8, 16, 32)]
def get_init_inputs():
    return []
"""


def test_a_problem_whose_output_is_its_own_rounding_is_unsound_and_no_answer_is_verified(tmp_path):
    """No parameter to draw: the output is zero up to rounding on every distribution, so the tolerance
    the baseline's own error sets admits any answer of the right scale. Every candidate gets
    `unsound_problem`, never `verified`: a zeros answer passes everything here."""
    got = _evaluate_one(tmp_path, NORM_MEAN, "99_NormMean", {"zeros": HEADER + (
        "class ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return torch.zeros(x.shape[0], device=x.device)\n")})
    verdict = got["zeros"]
    assert verdict.status is Status.UNSOUND_PROBLEM, (verdict.status, verdict.message)
    assert "no input distribution judges anything" in verdict.message, verdict.message
    assert verdict.speedup is None


EXP_SCALED = HEADER + ("class Model(nn.Module):\n    def forward(self, x):\n        return torch.exp(x * 1e-3)\n"
                       + INPUTS)


def test_one_distributions_weakness_is_a_note_not_a_category_of_the_pair(tmp_path):
    """exp(x / 1000) on `small` inputs is 1 up to a few ulps: ones, the mean and the output at other
    inputs pass there, and only there. The problem is sound; the pair carries no `unsound_problem`."""
    got = _evaluate_one(tmp_path, EXP_SCALED, "98_ExpScaled", {"mine": HEADER + (
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.exp(x / 1000.0)\n")})
    verdict = got["mine"]
    assert not verdict.flags and Category.UNSOUND_PROBLEM not in verdict.categories, (verdict.flags,
                                                                                      verdict.categories)
    notes = verdict.evidence["problem_notes"]
    assert any(n.startswith("the output at other inputs passes on small") and n.endswith("only") for n in notes), notes
