"""Loading problems: one file, a level1/.. tree, KernelBench's Parquet columns, the bundled suite;
malformed problems fail with an error that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kbv.errors import ProblemLoadError, ProblemRunError, UsageError
from kbv.problems import content_hash, find_problem, instantiate_problem, level_dirs, load_problems
from kbv.protocols.standard import StandardProtocol
from kbv.protocols.standard import prepare_standard
from sources import (GET_INPUTS_RAISES_PROBLEM, LINEAR_PROBLEM, NO_MODEL_PROBLEM, RELU_PROBLEM,
                     SYNTAX_ERROR_PROBLEM, write_tree)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "problems", {
        "level1/19_ReLU.py": RELU_PROBLEM,
        "level1/3_Linear.py": LINEAR_PROBLEM,
        "level2/19_ReLU.py": RELU_PROBLEM,
        "level1/_helpers.py": "x = 1\n",  # private modules are not problems
    })


NOT_A_PROBLEM = "def summarize(rows):\n    return len(rows)\n"


@pytest.fixture
def kernelbench_repo(tmp_path: Path) -> Path:
    """A repository shaped like KernelBench's: problems under KernelBench/levelN/, and beside them
    Python that is no problem (`src/`, `scripts/`), one file even shaped like one (a prompt example),
    and level folders where none may be looked for (a virtual environment, a hidden folder)."""
    return write_tree(tmp_path / "repo", {
        "KernelBench/level1/19_ReLU.py": RELU_PROBLEM,
        "KernelBench/level1/12_Matmul_diag_.py": RELU_PROBLEM,
        "KernelBench/level2/3_Linear.py": LINEAR_PROBLEM,
        "KernelBench/level3/55_conv_2D__asymmetric__square_kernel.py": RELU_PROBLEM,
        "src/kernelbench/analysis.py": NOT_A_PROBLEM,
        "src/kernelbench/prompts/model_ex_0.py": RELU_PROBLEM,  # shaped like a problem, not in a level folder
        "scripts/run_and_check.py": NOT_A_PROBLEM,
        "kbenv/pyvenv.cfg": "home = /usr/bin\n",
        "kbenv/lib/level1/x.py": NOT_A_PROBLEM,
        ".git/level1/x.py": NOT_A_PROBLEM,
    })


KERNELBENCH_KEYS = ["L1/12_Matmul_diag_", "L1/19_ReLU", "L2/3_Linear",
                    "L3/55_conv_2D__asymmetric__square_kernel"]


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# -- good inputs ---------------------------------------------------------------------------------

def test_one_file_takes_id_and_name_from_its_stem(tmp_path: Path) -> None:
    path = write_tree(tmp_path, {"19_ReLU.py": RELU_PROBLEM}) / "19_ReLU.py"
    [problem] = load_problems(path)
    assert (problem.name, problem.problem_id, problem.level) == ("19_ReLU", 19, None)
    assert problem.key == "19_ReLU"
    assert problem.origin == str(path)
    assert problem.code == RELU_PROBLEM


def test_directory_tree_takes_levels_from_folders_and_sorts(tree: Path) -> None:
    problems = load_problems(tree)
    assert [p.key for p in problems] == ["L1/3_Linear", "L1/19_ReLU", "L2/19_ReLU"]
    assert [(p.level, p.problem_id) for p in problems] == [(1, 3), (1, 19), (2, 19)]
    assert problems[1].origin == str(tree / "level1" / "19_ReLU.py")


@pytest.mark.parametrize("where", ["", "KernelBench"], ids=["repository", "problem-folder"])
def test_kernelbench_repository_and_problem_folder_give_the_level_problems_only(kernelbench_repo: Path,
                                                                                 where: str) -> None:
    problems = load_problems(kernelbench_repo / where)
    assert [p.key for p in problems] == KERNELBENCH_KEYS
    assert all(Path(p.origin).parent.parent == kernelbench_repo / "KernelBench" for p in problems)


def test_level_folders_are_looked_for_a_few_levels_down_outside_hidden_folders_and_venvs(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"a/b/level1/1_X.py": RELU_PROBLEM, "a/b/c/level2/2_Y.py": RELU_PROBLEM,
                                 "level_3/3_Z.py": RELU_PROBLEM, "level_3/level1/4_W.py": RELU_PROBLEM,
                                 ".hidden/level1/5_V.py": RELU_PROBLEM, "venv/pyvenv.cfg": "",
                                 "venv/level1/6_U.py": RELU_PROBLEM, "__pycache__/level1/7_T.py": RELU_PROBLEM})
    assert level_dirs(root) == [root / "a" / "b" / "level1", root / "level_3"]  # a/b/c/level2 is 4 down
    assert [p.key for p in load_problems(root)] == ["L1/1_X", "L1/4_W", "L3/3_Z"]  # 4_W: its nearest level


def test_a_level_folder_alone_is_a_plain_directory_of_its_level(kernelbench_repo: Path) -> None:
    problems = load_problems(kernelbench_repo / "KernelBench" / "level1")
    assert [p.key for p in problems] == KERNELBENCH_KEYS[:2]


def test_the_same_key_from_two_level_folders_is_an_error(kernelbench_repo: Path) -> None:
    write_tree(kernelbench_repo, {"level1/19_ReLU.py": RELU_PROBLEM})
    with pytest.raises(ProblemLoadError, match=r"Two problems named L1/19_ReLU: .*KernelBench/level1/19_ReLU\.py "
                                               r"and .*repo/level1/19_ReLU\.py"):
        load_problems(kernelbench_repo)


def test_a_directory_without_a_problem_says_so_in_one_line(kernelbench_repo: Path) -> None:
    scripts = kernelbench_repo / "scripts"
    with pytest.raises(UsageError, match=rf"^No KernelBench problem under '{scripts}' \(1 \.py file; .*run_and_check"
                                         r"\.py: not a KernelBench problem: missing Model, get_inputs, get_init_inputs\)$"):
        load_problems(scripts)
    empty_levels = write_tree(kernelbench_repo.parent / "empty", {"level1/README.md": "", "level2/_init.py": ""})
    with pytest.raises(UsageError, match=r"^No problem files \(\*\.py\) under the level folders of '.*empty' "
                                         r"\(level1, level2\)\.$"):
        load_problems(empty_levels)


def test_a_problem_folder_of_kernelbench_loads_whole(kernelbench_dir: Path) -> None:
    """KernelBench's own problem folder, with its `src/` beside the levels: every file of a level
    folder is a problem, and nothing else is."""
    problems = load_problems(kernelbench_dir)
    in_levels = sorted(kernelbench_dir.glob("level*/*.py"))
    assert len(problems) == len(in_levels) >= 250
    assert sorted(Path(p.origin) for p in problems) == in_levels
    assert {p.level for p in problems} >= {1, 2, 3}
    assert len({p.key for p in problems}) == len(problems)


def test_a_level_file_alone_keeps_its_level(tree: Path) -> None:
    [problem] = load_problems(tree / "level2" / "19_ReLU.py")
    assert problem.key == "L2/19_ReLU"


def test_parquet_with_kernelbench_columns(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "kb.parquet", [
        {"code": LINEAR_PROBLEM, "level": 1, "name": "3_Linear.py", "problem_id": 3},
        {"code": RELU_PROBLEM, "level": 1, "name": "19_ReLU", "problem_id": 19},
        {"code": RELU_PROBLEM, "level": 2, "name": "19_ReLU", "problem_id": 19},
    ])
    problems = load_problems(path)
    assert [p.key for p in problems] == ["L1/3_Linear", "L1/19_ReLU", "L2/19_ReLU"]
    assert problems[0].problem_id == 3 and problems[0].code == LINEAR_PROBLEM
    assert problems[2].origin == f"parquet:{path}#2"


def test_parquet_without_code_column_names_file_and_columns(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "bad.parquet", [{"name": "19_ReLU", "level": 1}])
    with pytest.raises(ProblemLoadError, match=r"bad\.parquet.*missing column\(s\) code"):
        load_problems(path)


def test_parquet_with_a_malformed_row_names_the_row(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "kb.parquet", [
        {"code": RELU_PROBLEM, "level": 1, "name": "19_ReLU", "problem_id": 19},
        {"code": SYNTAX_ERROR_PROBLEM, "level": 1, "name": "20_Bad", "problem_id": 20},
    ])
    with pytest.raises(ProblemLoadError, match=r"kb\.parquet#1: syntax error at line 3"):
        load_problems(path)


def test_bundled_smoke_suite_by_name() -> None:
    keys = [p.key for p in load_problems("smoke")]
    assert len(keys) == 16
    assert {"L1/2_ReLU", "L1/6_Softmax", "L1/11_MSELoss"} <= set(keys)


def test_content_hash_ignores_line_endings_and_trailing_spaces() -> None:
    crlf = RELU_PROBLEM.replace("\n", "  \r\n")
    assert content_hash(crlf) == content_hash(RELU_PROBLEM)
    assert content_hash(RELU_PROBLEM.replace("randn(16", "randn(17")) != content_hash(RELU_PROBLEM)


@pytest.mark.parametrize("ref", ["L1/19_ReLU", "level1/19_ReLU", "L1/19", "level_1:19_relu", "L1/19_ReLU.py"])
def test_find_problem_accepts_the_usual_spellings(tree: Path, ref: str) -> None:
    assert find_problem(load_problems(tree), ref).key == "L1/19_ReLU"


def test_find_problem_reports_ambiguity_and_suggests(tree: Path) -> None:
    problems = load_problems(tree)
    with pytest.raises(UsageError, match="ambiguous: L1/19_ReLU, L2/19_ReLU"):
        find_problem(problems, "19_ReLU")
    with pytest.raises(UsageError, match="Unknown problem '19_RelU_x'. Did you mean 19_ReLU"):
        find_problem(problems, "19_RelU_x")


def test_instantiate_runs_the_problem_source() -> None:
    [problem] = load_problems("smoke")[1:2]
    module = instantiate_problem(problem)
    assert callable(module.Model) and callable(module.get_inputs) and module.get_init_inputs() == []


# -- bad inputs ----------------------------------------------------------------------------------

def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_tree(tmp_path, {"7_Bad.py": SYNTAX_ERROR_PROBLEM}) / "7_Bad.py"
    with pytest.raises(ProblemLoadError, match=rf"{path}: syntax error at line 3"):
        load_problems(path)


def test_missing_model_names_file_and_what_is_missing(tmp_path: Path) -> None:
    path = write_tree(tmp_path, {"7_NoModel.py": NO_MODEL_PROBLEM}) / "7_NoModel.py"
    with pytest.raises(ProblemLoadError, match=rf"{path}: not a KernelBench problem: missing Model"):
        load_problems(path)


def test_one_malformed_file_in_a_tree_is_named(tree: Path) -> None:
    write_tree(tree, {"level2/7_Bad.py": SYNTAX_ERROR_PROBLEM})
    with pytest.raises(ProblemLoadError, match=r"level2/7_Bad\.py: syntax error"):
        load_problems(tree)


def test_duplicate_keys_name_both_files(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"level1/19_ReLU.py": RELU_PROBLEM, "level_1/19_ReLU.py": RELU_PROBLEM})
    both = r"Two problems named L1/19_ReLU: .*level1/19_ReLU\.py and .*level_1/19_ReLU\.py"
    with pytest.raises(ProblemLoadError, match=both):
        load_problems(root)


def test_get_inputs_raising_is_a_problem_error_naming_the_file(tmp_path: Path) -> None:
    path = write_tree(tmp_path, {"8_NoInputs.py": GET_INPUTS_RAISES_PROBLEM}) / "8_NoInputs.py"
    [problem] = load_problems(path)  # statically fine: it only fails when run
    with pytest.raises(ProblemRunError, match=rf"{path}: .*cannot draw its inputs"):
        prepare_standard(problem, StandardProtocol(), torch.device("cpu"))


def test_top_level_failure_is_a_problem_error_naming_the_file(tmp_path: Path) -> None:
    code = RELU_PROBLEM + "\nraise ImportError('kbv-test: missing dependency')\n"
    path = write_tree(tmp_path, {"9_Import.py": code}) / "9_Import.py"
    [problem] = load_problems(path)
    with pytest.raises(ProblemRunError, match=rf"{path}: executing the problem raised ImportError"):
        instantiate_problem(problem)


@pytest.mark.parametrize(("spec", "message"), [
    ("smok", r"No problems at 'smok'.*Did you mean smoke\?"),
    ("no/such/dir", r"No problems at 'no/such/dir'"),
])
def test_unknown_spec_is_a_usage_error(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_problems(spec)


def test_wrong_file_type_and_empty_dir_are_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="expected a .py file, a directory or a .parquet file"):
        load_problems(tmp_path / "notes.txt")
    with pytest.raises(UsageError, match="No problem files"):
        load_problems(tmp_path / "empty")
