"""Reading candidates in every layout, pairing them with problems, and reporting (never dropping)
the ones that pair with nothing or with several problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.candidates import (Backend, Candidate, Pairing, Unpaired, compiles_when_constructed, detect_backend, has_code,
                            load_candidates, unpaired_lines)
from kbv.errors import CandidateSourceError, UsageError
from kbv.problems import Problem, load_problems
from sources import (CPP_BROKEN, CPP_RELU, CPP_RELU_FROM_FILES, CUDA_RELU, HONEST_LINEAR, HONEST_RELU,
                     LINEAR_PROBLEM, NO_CODE, RELU_PROBLEM, SYNTAX_ERROR, TRITON_RELU, WRONG_RELU, write_tree)


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> list[Problem]:
    """L1/3_Linear, L1/19_ReLU, L2/19_ReLU (so a bare '19_ReLU' is ambiguous)."""
    root = write_tree(tmp_path_factory.mktemp("problems"), {
        "level1/19_ReLU.py": RELU_PROBLEM, "level1/3_Linear.py": LINEAR_PROBLEM, "level2/19_ReLU.py": RELU_PROBLEM,
    })
    return load_problems(root)


def _paired(pairing: Pairing) -> dict[str, str]:
    """{candidate name: problem key}."""
    return {p.candidate.name: p.problem.key for p in pairing.pairs}


def _unpaired(pairing: Pairing) -> dict[str, str]:
    """{candidate name: reason}."""
    return {u.candidate.name: u.reason for u in pairing.unpaired}


# -- layouts -------------------------------------------------------------------------------------

def test_single_file_with_a_single_problem_pairs_whatever_its_name(tmp_path: Path) -> None:
    [problem] = load_problems(write_tree(tmp_path / "p", {"19_ReLU.py": RELU_PROBLEM}) / "19_ReLU.py")
    cand = write_tree(tmp_path / "c", {"my_kernel.py": HONEST_RELU}) / "my_kernel.py"
    pairing = load_candidates(cand, [problem])
    assert _paired(pairing) == {"my_kernel": "19_ReLU"} and not pairing.unpaired
    assert pairing.pairs[0].candidate.code == HONEST_RELU


def test_single_file_among_several_problems_pairs_by_name(tmp_path: Path, problems: list[Problem]) -> None:
    cand = write_tree(tmp_path, {"3_Linear.py": HONEST_LINEAR}) / "3_Linear.py"
    assert _paired(load_candidates(cand, problems)) == {"3_Linear": "L1/3_Linear"}


def test_directory_named_after_problems(tmp_path: Path, problems: list[Problem]) -> None:
    root = write_tree(tmp_path, {
        "3_Linear.py": HONEST_LINEAR,
        "3_Linear__fast.py": HONEST_LINEAR,
        "3_Linear/attempt_2.py": HONEST_LINEAR,
        "level1/19_ReLU.py": HONEST_RELU,
        "level2/19_ReLU__v2.py": HONEST_RELU,
        "linear.py": HONEST_LINEAR,  # the part after the id, any case
    })
    pairing = load_candidates(root, problems)
    assert _paired(pairing) == {
        "3_Linear": "L1/3_Linear",
        "3_Linear__fast": "L1/3_Linear",
        "3_Linear/attempt_2": "L1/3_Linear",
        "level1/19_ReLU": "L1/19_ReLU",
        "level2/19_ReLU__v2": "L2/19_ReLU",
        "linear": "L1/3_Linear",
    }
    assert not pairing.unpaired
    origins = {p.candidate.origin for p in pairing.pairs}
    assert str(root / "3_Linear" / "attempt_2.py") in origins


def test_kernelbench_names_with_double_underscores_pair_with_the_longest_problem_name(tmp_path: Path) -> None:
    """KernelBench's own names hold `__`; a label after the name is cut at a `__` too. The longest
    problem name a candidate's name begins with wins, with or without a label or a level folder."""
    long_name = "55_conv_standard_2D__asymmetric_input__square_kernel"
    problems = load_problems(write_tree(tmp_path / "p", {
        f"level1/{long_name}.py": RELU_PROBLEM,
        "level1/55_conv_standard_2D.py": RELU_PROBLEM,  # a shorter name the long one begins with
        "level2/7_Conv3d__ReLU.py": RELU_PROBLEM,
        "level1/76_conv_1D_dilated__.py": RELU_PROBLEM,  # names may end in underscores too
    }))
    root = write_tree(tmp_path / "c", {
        f"level1/{long_name}.py": HONEST_RELU,
        f"{long_name}__sample_3.py": HONEST_RELU,
        "55_conv_standard_2D__mine.py": HONEST_RELU,
        "level2/7_Conv3d__ReLU__fast.py": HONEST_RELU,
        "level2/7_Conv3d__Relu_x.py": HONEST_RELU,  # no such name: cut back to one that is not a problem
        "level1/76_conv_1D_dilated__.py": HONEST_RELU,
        "76_conv_1D_dilated____x.py": HONEST_RELU,
    })
    pairing = load_candidates(root, problems)
    assert _paired(pairing) == {
        f"level1/{long_name}": f"L1/{long_name}",
        f"{long_name}__sample_3": f"L1/{long_name}",
        "55_conv_standard_2D__mine": "L1/55_conv_standard_2D",
        "level2/7_Conv3d__ReLU__fast": "L2/7_Conv3d__ReLU",
        "level1/76_conv_1D_dilated__": "L1/76_conv_1D_dilated__",
        "76_conv_1D_dilated____x": "L1/76_conv_1D_dilated__",
    }
    assert _unpaired(pairing)["level2/7_Conv3d__Relu_x"].startswith("no problem named 'L2/7_Conv3d'.")


# KernelBench's kinds of names: ending in `_`, holding `__`, both (ending in `__` after inner `__`s)
ODD_STEMS = ("12_Matmul_diag_", "55_conv_2D__asym__square", "75_convT_2D_strided__grouped____padded__",
             "76_conv_1D_dilated__")
TAGS = ("x", "triton", "sample_3", "cuda__v2", "_fast")


@pytest.fixture(scope="module")
def odd_problems(tmp_path_factory: pytest.TempPathFactory) -> list[Problem]:
    """The odd stems at level 1, with problems whose names they begin with (a trap for a cut too
    short), and 19_ReLU at levels 1 and 2."""
    root = tmp_path_factory.mktemp("odd")
    files = {f"level1/{stem}.py": RELU_PROBLEM for stem in ODD_STEMS}
    files |= {"level1/12_Matmul_diag.py": RELU_PROBLEM, "level1/55_conv_2D.py": RELU_PROBLEM,
              "level1/19_ReLU.py": RELU_PROBLEM, "level2/19_ReLU.py": RELU_PROBLEM}
    return load_problems(write_tree(root, files))


@pytest.mark.parametrize("folder", ["", "level1/"], ids=["flat", "level-folder"])
def test_every_stem_pairs_as_itself_and_with_any_tag(tmp_path: Path, odd_problems: list[Problem], folder: str) -> None:
    """`<stem>.py` and `<stem>__<tag>.py` pair with that problem, whatever the stem ends in or holds,
    and whatever the tag holds: the longest problem name the file's name begins with before a `__`."""
    names = [stem for stem in ODD_STEMS] + [f"{stem}__{tag}" for stem in ODD_STEMS for tag in TAGS]
    pairing = load_candidates(write_tree(tmp_path, {f"{folder}{n}.py": HONEST_RELU for n in names}), odd_problems)
    assert not pairing.unpaired, _unpaired(pairing)
    paired = {p.candidate.name.removeprefix(folder): p.problem.name for p in pairing.pairs}
    assert paired == {n: next(s for s in ODD_STEMS if n == s or n.startswith(f"{s}__")) for n in names}


def test_a_shorter_problem_name_still_pairs_and_ambiguity_is_still_told(tmp_path: Path,
                                                                        odd_problems: list[Problem]) -> None:
    root = write_tree(tmp_path, {
        "12_Matmul_diag__x.py": HONEST_RELU,  # the name without the trailing _
        "55_conv_2D__mine.py": HONEST_RELU,
        "19_ReLU___x.py": HONEST_RELU,  # a tag beginning with _: no '19_ReLU_' problem, so 19_ReLU
        "12_Matmul_dag___x.py": HONEST_RELU,  # a typo
    })
    pairing = load_candidates(root, odd_problems)
    assert _paired(pairing) == {"12_Matmul_diag__x": "L1/12_Matmul_diag", "55_conv_2D__mine": "L1/55_conv_2D"}
    reasons = _unpaired(pairing)
    assert reasons["19_ReLU___x"] == "'19_ReLU___x' is ambiguous: L1/19_ReLU, L2/19_ReLU"
    assert reasons["12_Matmul_dag___x"].startswith("no problem named '12_Matmul_dag'. Did you mean 12_Matmul_diag")


def test_every_kernelbench_problem_pairs_with_its_own_names(tmp_path: Path, kernelbench_dir: Path) -> None:
    """Over KernelBench's own problems: `levelN/<stem>.py` and `levelN/<stem>__x.py` each pair with
    exactly that problem."""
    problems = load_problems(kernelbench_dir)
    files = {f"level{p.level}/{p.name}{tag}.py": HONEST_RELU for p in problems for tag in ("", "__x")}
    pairing = load_candidates(write_tree(tmp_path, files), problems)
    assert not pairing.unpaired, [u.describe() for u in pairing.unpaired[:5]]
    got = {p.candidate.name: p.problem.key for p in pairing.pairs}
    assert got == {f"level{p.level}/{p.name}{tag}": p.key for p in problems for tag in ("", "__x")}


def test_unpaired_lines_are_capped_with_a_count() -> None:
    unpaired = [Unpaired(Candidate("x", f"n{i}", f"c/n{i}.py", f"n{i}"), f"no problem named 'n{i}'.") for i in range(5)]
    assert unpaired_lines(unpaired, 5) == [f"c/n{i}.py: no problem named 'n{i}'." for i in range(5)]
    assert unpaired_lines(unpaired, 2) == ["c/n0.py: no problem named 'n0'.", "c/n1.py: no problem named 'n1'.",
                                           "... and 3 more"]


def test_kernelbench_run_directory(tmp_path: Path, problems: list[Problem]) -> None:
    root = write_tree(tmp_path, {
        "level_1_problem_19_sample_0_kernel.py": HONEST_RELU,
        "level_1_problem_19_sample_1_kernel.py": WRONG_RELU,
        "level_2_problem_19_sample_0_kernel.py": HONEST_RELU,
        "level_1_problem_3_sample_4_kernel.py": HONEST_LINEAR,
        "level_3_problem_1_sample_0_kernel.py": HONEST_RELU,
    })
    pairing = load_candidates(root, problems)
    got = {(p.problem.key, p.candidate.sample) for p in pairing.pairs}
    assert got == {("L1/19_ReLU", 0), ("L1/19_ReLU", 1), ("L2/19_ReLU", 0), ("L1/3_Linear", 4)}
    assert _unpaired(pairing) == {"level_3_problem_1_sample_0_kernel": "no problem named 'L3/P1'."}


def test_jsonl_records(tmp_path: Path, problems: list[Problem]) -> None:
    lines = [
        {"problem": "L1/19_ReLU", "code": HONEST_RELU, "model": "gpt-x", "sample": 0},
        {"problem": "L1/19_ReLU", "code": WRONG_RELU, "model": "gpt-x", "sample": 1},
        {"problem": "3_Linear", "code": HONEST_LINEAR},
        {"problem": "L2/19", "code": HONEST_RELU, "model": "claude-y"},
    ]
    path = tmp_path / "gen.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines[:2]) + "\n\n" + "\n".join(json.dumps(r) for r in lines[2:]))
    pairing = load_candidates(path, problems)
    cands = [p.candidate for p in pairing.pairs]
    assert [(c.problem_ref, c.model, c.sample) for c in cands] == [
        ("L1/19_ReLU", "gpt-x", 0), ("L1/19_ReLU", "gpt-x", 1), ("3_Linear", None, None), ("L2/19", "claude-y", None)]
    assert [p.problem.key for p in pairing.pairs] == ["L1/19_ReLU", "L1/19_ReLU", "L1/3_Linear", "L2/19_ReLU"]
    assert len({c.name for c in cands}) == 4  # samples of one model and problem stay apart
    assert cands[0].code == HONEST_RELU
    assert cands[3].origin == f"{path}:5"  # line numbers count the blank line


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", r"gen\.jsonl:2: not valid JSON"),
    ('{"problem": "3_Linear"}', r"gen\.jsonl:2: each line needs 'problem' and 'code'"),
    ('["3_Linear", "x"]', r"gen\.jsonl:2: each line needs 'problem' and 'code'"),
    ('{"problem": "3_Linear", "code": "x", "sample": "first"}', r"gen\.jsonl:2: 'sample' must be an integer"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, problems: list[Problem], line: str, message: str) -> None:
    path = tmp_path / "gen.jsonl"
    path.write_text(json.dumps({"problem": "3_Linear", "code": HONEST_LINEAR}) + "\n" + line + "\n")
    with pytest.raises(CandidateSourceError, match=message):
        load_candidates(path, problems)


# -- unpaired and ambiguous ----------------------------------------------------------------------

def test_unpaired_and_ambiguous_are_reported_with_reasons(tmp_path: Path, problems: list[Problem]) -> None:
    root = write_tree(tmp_path, {
        "3_Linear.py": HONEST_LINEAR,
        "19_ReLU.py": HONEST_RELU,  # L1 and L2 both have it
        "19_RelU_x.py": HONEST_RELU,  # a typo
        "42_Nothing__a.py": HONEST_RELU,
    })
    pairing = load_candidates(root, problems)
    assert _paired(pairing) == {"3_Linear": "L1/3_Linear"}
    reasons = _unpaired(pairing)
    assert reasons["19_ReLU"] == "'19_ReLU' is ambiguous: L1/19_ReLU, L2/19_ReLU"
    # a name two levels share is suggested by its keys, each once: the bare name would be ambiguous
    assert reasons["19_RelU_x"] == "no problem named '19_RelU_x'. Did you mean L1/19_ReLU or L2/19_ReLU?"
    assert reasons["42_Nothing__a"] == "no problem named '42_Nothing'."
    assert len(pairing.pairs) + len(pairing.unpaired) == 4  # nothing dropped


def test_a_run_with_nothing_paired_says_why(tmp_path: Path, relu_problems: Path, cache_dir: Path) -> None:
    root = write_tree(tmp_path / "c", {"42_Nothing.py": HONEST_RELU})
    config = EvalConfig(candidates=str(root), problems=str(relu_problems), device="cpu",
                        run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir))
    with pytest.raises(UsageError, match=r"^No candidate pairs with a problem of '.*' \(1 unpaired\): "
                                         r".*42_Nothing\.py: no problem named '42_Nothing'$"):
        evaluate(config)


@pytest.mark.parametrize(("name", "message"), [
    ("missing", "No candidates at .*missing.*: no such file or directory"),
    ("notes.txt", "expected a .py file, a directory or a .jsonl file"),
    ("empty", r"No candidate files \(\*\.py\)"),
])
def test_unreadable_candidate_sources(tmp_path: Path, problems: list[Problem], name: str, message: str) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CandidateSourceError, match=message):
        load_candidates(tmp_path / name, problems)


# -- what a candidate is -------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "backend"), [
    (CUDA_RELU, Backend.CUDA),
    (TRITON_RELU, Backend.TRITON),
    (CPP_RELU, Backend.CPP),
    (CPP_BROKEN, Backend.CPP),
    (CPP_RELU_FROM_FILES, Backend.CPP),  # `load` imported by name, of sources it writes: built too
    (HONEST_RELU, Backend.TORCH),
])
def test_backend_detection(code: str, backend: Backend) -> None:
    assert detect_backend(code) is backend


def test_backends_run_where_they_can() -> None:
    assert [b.value for b in Backend if b.runs_on("cpu")] == ["triton", "cpp", "torch"]
    assert [b.value for b in Backend if b.runs_on("cuda")] == ["cuda", "triton", "torch"]


def test_no_code_detection(tmp_path: Path, problems: list[Problem]) -> None:
    assert not has_code(NO_CODE) and not has_code("") and not has_code("   \n\t\n")
    assert has_code(HONEST_RELU)
    assert has_code(SYNTAX_ERROR)  # malformed code is still code: the build reports it
    lines = [
        {"problem": "3_Linear", "code": NO_CODE},
        {"problem": "3_Linear", "code": None},
        {"problem": "3_Linear", "code": HONEST_LINEAR, "status": "no_code"},
        {"problem": "3_Linear", "code": HONEST_LINEAR, "sample": 3},
    ]
    path = tmp_path / "gen.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines))
    flags = [p.candidate.no_code for p in load_candidates(path, problems).pairs]
    assert flags == [True, True, True, False]
    root = write_tree(tmp_path / "dir", {"3_Linear.py": NO_CODE})
    assert load_candidates(root, problems).pairs[0].candidate.no_code


def test_a_candidate_that_builds_in_its_constructor_is_told_from_one_that_builds_at_import() -> None:
    """The build phase constructs only the candidates whose extension is built in a function."""
    at_import = "from torch.utils.cpp_extension import load_inline\next = load_inline(name='e', cpp_sources='')\n"
    in_init = ("import torch.utils.cpp_extension as ce\nclass ModelNew:\n    def __init__(self):\n"
               "        self.ext = ce.load_inline(name='e', cpp_sources='')\n")
    loads_files = ("from torch.utils.cpp_extension import load\nclass ModelNew:\n    def __init__(self):\n"
                   "        self.ext = load(name='e', sources=['k.cpp'])\n")
    other_load = "import json\ndef f(p):\n    return json.load(open(p))\n"
    assert not compiles_when_constructed(at_import)
    assert compiles_when_constructed(in_init)
    assert compiles_when_constructed(loads_files)
    assert not compiles_when_constructed(other_load)
    assert not compiles_when_constructed("def broken(:\n")


def test_a_typo_of_a_name_two_levels_share_is_answered_with_their_keys(tmp_path: Path,
                                                                       problems: list[Problem]) -> None:
    """The likeness is the name's ('19_ReLV' against '19_ReLU': a key's 'L1/' would lower it, past the cutoff
    for short names), and the reference's own level, where it names one, picks that level's problem."""
    root = write_tree(tmp_path, {"19_ReLV__a.py": HONEST_RELU, "level2/19_ReLV__b.py": HONEST_RELU})
    reasons = _unpaired(load_candidates(root, problems))
    assert reasons["19_ReLV__a"] == "no problem named '19_ReLV'. Did you mean L1/19_ReLU or L2/19_ReLU?"
    assert reasons["level2/19_ReLV__b"] == "no problem named 'L2/19_ReLV'. Did you mean L2/19_ReLU?"
