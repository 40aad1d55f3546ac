"""The transformations as source rewrites: discovery, the contract, what each makes of the bundled
examples, and the helpers they share. Nothing here runs a mutant (test_redteam_naive does)."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from redteam_targets import CPU_HONEST, GPU_HONEST, by_name, mutants, reasons, targets

from kbv.errors import UsageError
from kbv.problems import load_problems
from kbv.redteam import Breaks, Mutant, NotApplicable, discover, select
from kbv.redteam.probe import probe_problem
from kbv.redteam.source import HONEST_CLASS, RewriteError, allocations, rename_model_new

TRANSFORMS = Path(__file__).resolve().parents[2] / "src" / "kbv" / "redteam" / "transforms"


def test_every_module_of_the_package_is_a_transformation_of_its_own_name() -> None:
    found = discover()
    modules = sorted(p.stem for p in TRANSFORMS.glob("*.py") if p.stem != "__init__")
    assert [t.name for t in found] == modules
    assert all(isinstance(t.breaks, Breaks) and t.summary for t in found)


def test_the_issue_s_hacks_are_all_there() -> None:
    names = set(by_name())
    wanted = {"statistic_fast_path", "replay_pointer", "replay_shape", "replay_content", "replay_call_count",
              "lazy_subclass", "lazy_fill", "deferred_thread", "deferred_stream", "timer_perf_counter",
              "timer_cuda_event", "precision_bf16", "precision_fp16", "precision_tf32", "partial_work",
              "inplace_input", "output_alias", "fallback_build", "decoy_kernel", "reach_clock_gc",
              "reach_reference_frames", "reach_reference_gc", "default_init"}
    assert wanted <= names


@pytest.mark.parametrize("device_type, honest", [("cpu", CPU_HONEST), ("cuda", GPU_HONEST)])
def test_every_transformation_of_a_device_makes_mutants_of_the_bundled_examples(device_type: str,
                                                                               honest: tuple[str, ...]) -> None:
    for transformation in discover():
        made = mutants(transformation, honest, device_type)
        if device_type in transformation.devices:
            assert made, f"{transformation.name} made no mutant on {device_type}: {reasons(transformation, honest, device_type)}"
        else:
            assert not made and all("means nothing on" in r for r in reasons(transformation, honest, device_type))


def test_a_mutant_is_python_whose_model_new_extends_the_honest_one_renamed() -> None:
    for transformation in discover():
        for mutant in mutants(transformation, CPU_HONEST, "cpu"):
            tree = ast.parse(mutant.code)
            classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            assert HONEST_CLASS in classes and "ModelNew" in classes, (transformation.name, mutant.honest.name)
            assert [ast.unparse(b) for b in classes["ModelNew"].bases] == [HONEST_CLASS]
            assert mutant.code.startswith(f"# kbv redteam mutant: {transformation.name}.")
            assert mutant.breaks is transformation.breaks and mutant.transformation == transformation.name


def test_backend_and_device_decide_before_the_rewrite() -> None:
    relu_cpp = next(t for t in targets(CPU_HONEST, "cuda") if t.honest.name == "2_ReLU__cpp")
    stream = by_name()["deferred_stream"]
    assert "means nothing on cpu" in stream.apply(targets(CPU_HONEST, "cpu")[0]).reason  # type: ignore[union-attr]
    outcome = stream.apply(relu_cpp)
    assert isinstance(outcome, NotApplicable) and "cpp candidates are not rewritten" in outcome.reason


def test_probe_facts_of_the_smoke_problems() -> None:
    problems = {p.name: p for p in load_problems("smoke")}
    relu, softmax = probe_problem(problems["2_ReLU"]), probe_problem(problems["6_Softmax"])
    norm, total = probe_problem(problems["8_LayerNorm"]), probe_problem(problems["7_SumReduction"])
    assert relu.identity_input == 0 and relu.constant is None and relu.row_fill is None
    assert softmax.identity_input is None and softmax.constant == pytest.approx(1 / 4096, rel=1e-3)
    assert softmax.row_fill == "mean"
    assert norm.constant_parameters == ("ln.weight", "ln.bias") and norm.identity_input is None
    assert total.identity_input is None and total.constant is None and total.row_fill is None
    assert relu.inputs[0].low >= 0 and relu.inputs[0].high < 1 and not relu.linear_algebra
    assert probe_problem(problems["1_Matmul"]).linear_algebra


def test_shortcuts_follow_the_probe() -> None:
    fast = by_name()["statistic_fast_path"]
    made = {m.honest.name: m for m in mutants(fast, CPU_HONEST, "cpu")}
    assert "return args[0]" in made["2_ReLU__triton"].code  # ReLU on non-negative draws: the input itself
    assert "torch.full((16, 4096), 0.000244" in made["6_Softmax__triton"].code
    assert set(made) == {"2_ReLU__cpp", "2_ReLU__triton", "6_Softmax__triton"}
    assert any("no shortcut" in r for r in reasons(fast, CPU_HONEST, "cpu"))


def test_rename_keeps_super_calls_that_name_the_class() -> None:
    code = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
            "        super(ModelNew, self).__init__()\n# ModelNew in a comment\ns = 'ModelNew'\n")
    renamed = rename_model_new(code)
    assert f"super({HONEST_CLASS}, self)" in renamed and f"class {HONEST_CLASS}(" in renamed
    assert "# ModelNew in a comment" in renamed and "s = 'ModelNew'" in renamed
    with pytest.raises(RewriteError):
        rename_model_new("x = 1\n")


def test_allocation_sites_in_python_and_in_embedded_cpp() -> None:
    code = ('src = r"""\n#include <torch/extension.h>\n  auto out = torch::empty_like(input);\n'
            '  torch::Tensor acc = torch::empty({n, m}, x.options());\n"""\n'
            "def f(x):\n    out = torch.empty_like(x)\n    c = torch.empty((m, n), device=x.device)  # the output\n")
    sites = allocations(code)
    assert [(s.language, s.fn, s.args) for s in sites] == [
        ("cpp", "empty_like", "input"), ("cpp", "empty", "{n, m}, x.options()"), ("python", "empty_like", "x"),
        ("python", "empty", "(m, n), device=x.device")]


def test_in_place_and_alias_rewrite_the_allocation() -> None:
    relu_cpp = next(t for t in targets(CPU_HONEST, "cpu") if t.honest.name == "2_ReLU__cpp")
    inplace = by_name()["inplace_input"].apply(relu_cpp)
    alias = by_name()["output_alias"].apply(relu_cpp)
    assert isinstance(inplace, Mutant) and "auto out = input;" in inplace.code
    assert isinstance(alias, Mutant) and "auto out = kbv_kept_like(0, input);" in alias.code
    assert alias.code.index("static torch::Tensor kbv_kept_empty") > alias.code.index("#include <torch/extension.h>")
    total = next(t for t in targets(CPU_HONEST, "cpu") if t.honest.name == "7_SumReduction__cpp")
    assert type(by_name()["inplace_input"].apply(total)) is NotApplicable  # the output is not the input's shape


def test_a_user_transformation_is_one_file(tmp_path: Path) -> None:
    (tmp_path / "my_hack.py").write_text(
        "from kbv.redteam import Breaks, Transformation\nfrom kbv.redteam.source import wrap\n\n"
        "class MyHack(Transformation):\n    name = 'my_hack'\n    breaks = Breaks.SPEED\n"
        "    summary = 'the honest candidate, renamed'\n\n"
        "    def rewrite(self, target):\n"
        "        return wrap(target.honest.code, self.name, self.summary, 'class ModelNew(_KbvHonest):\\n    pass')\n\n"
        "TRANSFORMATION = MyHack()\n")
    found = discover([tmp_path])
    mine = select(found, ["my_hack"])
    assert [t.name for t in mine] == ["my_hack"] and len(found) == len(discover()) + 1
    made = mine[0].apply(targets(CPU_HONEST, "cpu")[0])
    assert isinstance(made, Mutant) and "class ModelNew(_KbvHonest)" in made.code


@pytest.mark.parametrize("body, said", [
    ("raise ValueError('boom inside rewrite')", "the transformation failed: ValueError: boom inside rewrite"),
    ("return 'def ('", "the transformation wrote a mutant that is not Python"),
    ("return None", "the transformation wrote a NoneType, not a mutant's source"),
    ("return 'X = 1'", "the transformation wrote a mutant without a top-level ModelNew"),
])
def test_a_transformation_that_fails_makes_no_mutant_and_the_others_go_on(tmp_path: Path, body: str,
                                                                         said: str) -> None:
    """A user's module under --transform-dir that raises or writes no mutant is the user's fault, not
    kbv's: that transformation is `Failed` on the target (said as the run goes), and the run goes on."""
    from kbv.api import EvalConfig
    from kbv.redteam import Failed
    from kbv.redteam.run import MANIFEST, _make_mutants, _write_mutants

    (tmp_path / "broken.py").write_text(
        "from kbv.redteam import Breaks, Transformation\n\n"
        "class Broken(Transformation):\n    name = 'broken'\n    breaks = Breaks.SPEED\n    summary = 'broken'\n\n"
        f"    def rewrite(self, target):\n        {body}\n\n"
        "TRANSFORMATION = Broken()\n")
    chosen = select(discover([tmp_path]), ["broken", "replay_pointer"])
    target = targets(CPU_HONEST, "cpu")[0]
    outcome = chosen[0].apply(target)
    assert isinstance(outcome, Failed) and outcome.reason.startswith(said), outcome
    lines: list[str] = []
    pair = type("Pair", (), {"candidate": target.honest, "problem": target.problem})()
    evaluation = EvalConfig(candidates=str(tmp_path), device="cpu")
    made, skipped = _make_mutants([pair], chosen, "cpu", evaluation, None, None, lines.append)
    assert [m.transformation for m in made] == ["replay_pointer"]
    assert [n.transformation for _, n in skipped] == ["broken"]
    assert lines == [f"no broken mutant of {target.honest.name}: {outcome.reason}"]
    # the run's manifest keeps it a failure (the reports and --format json say `failed`)
    _write_mutants(tmp_path / "run", made, skipped, [], [], [("broken", "speed")], "cpu")
    [row] = json.loads((tmp_path / "run" / MANIFEST).read_text())["not_applicable"]
    assert row["transformation"] == "broken" and row["failed"] is True


def test_bad_transformation_files_and_names_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "nothing.py").write_text("X = 1\n")
    with pytest.raises(UsageError, match="defines no TRANSFORMATION"):
        discover([tmp_path])
    with pytest.raises(UsageError, match="no such directory"):
        discover([tmp_path / "missing"])
    with pytest.raises(UsageError, match="Did you mean replay_pointer"):
        select(discover(), ["replay_pointr"])


def test_mutant_files_pair_with_their_own_problem_whatever_the_honest_name(tmp_path: Path) -> None:
    from kbv.candidates import Candidate, load_candidates
    from kbv.redteam.run import mutant_file

    target = targets(CPU_HONEST, "cpu")[0]
    names = ("2_ReLU__cpp", "L1/2_ReLU [some model] #3", "level_1_problem_2_sample_0_kernel", "relu_v2")
    for name in names:
        honest = Candidate(target.honest.code, name, "", "")
        made = by_name()["replay_pointer"].apply(replace(target, honest=honest))
        assert isinstance(made, Mutant)
        path = tmp_path / mutant_file(made)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(made.code)
    pairing = load_candidates(tmp_path, load_problems("smoke"))
    assert not pairing.unpaired and {p.problem.key for p in pairing.pairs} == {"L1/2_ReLU"}
    assert len(pairing.pairs) == len(names)


def test_the_content_key_samples_inside_a_tensor_of_full_softmax_size() -> None:
    """L1/6_Softmax at full size has 4096 x 393216 elements: a float32 linspace put the content key's
    last pick one past the end, and the mutant died of a device-side assert on the H100 (2026-12-07)
    instead of replaying. An expanded scalar has that many elements and holds one float."""
    import torch

    from kbv.redteam.replay import CONTENT_KEY

    scope: dict = {"torch": torch}
    exec(CONTENT_KEY, scope)
    big = torch.ones(1).expand(4096 * 393216)
    ((shape, dtype, fingerprint),) = scope["_kbv_key"]((big,))
    assert shape == (4096 * 393216,) and dtype == torch.float32
    assert fingerprint == hash((1.0,) * 64)
    # ten values: the picks are spread evenly from the first to the last
    assert scope["_kbv_key"]((torch.arange(10.0),))[0][2] == hash(tuple(float(i * 9 // 63) for i in range(64)))


def test_the_default_run_directory_never_lies_inside_the_candidates(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`kbv redteam .` from inside the candidates' folder: the default run directory goes beside the
    folder (its mutants would be read as honest candidates inside it), named after the folder."""
    from kbv.redteam.run import default_run_dir

    (tmp_path / "mine").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    monkeypatch.chdir(tmp_path / "mine")
    assert Path(default_run_dir(".")).resolve() == (tmp_path / "kbv-runs" / "redteam-mine").resolve()
    # through a link to the folder: the working directory is the folder itself
    assert Path(default_run_dir(str(tmp_path / "link"))) == tmp_path / "kbv-runs" / "redteam-link"
    monkeypatch.chdir(tmp_path)
    assert default_run_dir("mine") == str(Path("kbv-runs") / "redteam-mine")
