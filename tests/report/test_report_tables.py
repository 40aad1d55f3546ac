"""Terminal tables at the width of a pipe: statuses, rules and categories are never cut, no line is
wider than the console, and speedups keep their digits. Through `kbv scan`, `kbv eval` and
`kbv report` in fresh processes, as a user pipes them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from kbv.metrics import metrics_by_group
from kbv.report.leaderboard import leaderboard
from kbv.report.tables import hacks_table, leaderboard_table, metrics_table, verdict_table
from kbv.verdict import Category, Status
from records import SAMPLE, verdict
from sources import WRONG_RELU, write_tree

SRC = Path(__file__).resolve().parents[2] / "src"
HACK_SOURCE = ("import torch\nimport threading\ntorch.cuda.Event.elapsed_time = lambda s, o: 1e-3\ncache = {}\n"
               "def f(x):\n    threading.Thread(target=f).start()\n    return cache[x.data_ptr()]\n")


def render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def kbv(*args: str, columns: int | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "kbv", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def assert_whole(text: str, words: set[str], width: int) -> None:
    """Each word stands whole on some line, and no line is wider than `width`."""
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    tokens = {t for line in lines for t in re.split(r"[\s│┃,;]+", line)}
    tokens |= {t.rstrip(":") for t in tokens}
    missing = {w for w in words if w not in tokens}
    assert not missing, f"cut or missing: {missing}\n{text}"


def test_the_verdict_table_at_80_columns_keeps_statuses_and_categories_whole() -> None:
    text = render(verdict_table(SAMPLE))
    words = {v.status.value for v in SAMPLE} | {c.value for v in SAMPLE for c in v.categories}
    assert_whole(text, words | {"0.0031x", "0.0029x", "40.0x"}, 80)
    assert "why" not in text.splitlines()[2]  # too narrow for the column: the whys follow the table
    assert "L3/1_MLP mlp_alias: standard: value_mismatch: max abs error 0.5; verified:" in text


def test_a_reason_every_protocol_gives_is_said_once() -> None:
    skipped = [verdict("L1/19_ReLU", "relu_cuda", p, Status.SKIPPED, message="a cuda candidate cannot run on cpu "
                       "(no CUDA device)") for p in ("standard", "verified")]
    text = " ".join(render(verdict_table(skipped + list(SAMPLE[8:10])), width=80).split())
    assert "relu_cuda: standard, verified: a cuda candidate cannot run on cpu (no CUDA device)" in text
    assert text.count("cannot run on cpu") == 1
    assert "mlp_alias: standard: value_mismatch: max abs error 0.5; verified: aliases_input:" in text


def test_the_verdict_table_has_a_why_column_where_there_is_room() -> None:
    text = render(verdict_table(SAMPLE), width=160)
    assert "why" in text.splitlines()[2] and max(len(line) for line in text.splitlines()) <= 160


def test_a_standard_speedup_shows_its_trials_spread_and_a_draw_says_so() -> None:
    marked = verdict("L1/2_ReLU", "relu_launch", "standard", Status.CORRECT, 1.25,
                     categories=(Category.UNSTABLE_TIMING,))
    note = "unstable_timing: the candidate's trials spread 30%"
    marked = replace(marked, timing=replace(marked.timing, notes=(note,)))
    text = render(verdict_table(SAMPLE + (marked,)), width=220)
    assert "1.80x ±2%" in text and "0.0031x ±1%" in text  # std/mean of both sides, combined
    assert "1.50x ±" not in text  # a verified speedup has an interval, not a spread
    assert f"standard: {note}" in text  # a passing verdict's why: the mark and its reason


def test_a_category_the_message_names_is_not_said_twice() -> None:
    text = render(verdict_table(SAMPLE), width=200)
    assert "aliases_input: the output aliases input 0" in text
    assert "aliases_input: aliases_input" not in text


@pytest.mark.parametrize("width", [80, 100])
def test_metrics_and_leaderboard_continue_rather_than_collapse(width: int) -> None:
    metrics = metrics_by_group(SAMPLE)
    text = render(metrics_table(metrics), width)
    headers = {"protocol", "group", "pairs", "compiled", "correct", "fast_0", "fast_0.5", "fast_0.8", "fast_1",
               "fast_1.5", "fast_2", "geomean"}
    assert_whole(text, headers | {"standard", "verified", "0.0029x"}, width)
    assert "Metrics (continued)" in text and "…" not in text
    board = render(leaderboard_table(leaderboard(SAMPLE)), width)
    assert_whole(board, {"model-a", "model-b", "geomean", "0.0031x", "rejects"}, width)
    assert "…" not in board
    assert_whole(render(hacks_table(metrics), width), {Category.RESULT_CACHE.value}, width)


def test_a_table_that_fits_is_one_table() -> None:
    assert "continued" not in render(metrics_table(metrics_by_group(SAMPLE)), 200)


def test_piped_scan_of_an_absolute_path_keeps_rule_severity_and_category(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "rather" / "deep" / "folder" / "of" / "candidates"
    one, two = deep / "candidate_with_a_long_name.py", tmp_path / "second.py"
    deep.mkdir(parents=True)
    one.write_text(HACK_SOURCE)
    two.write_text(HACK_SOURCE)
    result = kbv("scan", str(one), str(two), cwd=tmp_path)  # piped: rich's width is 80
    assert result.returncode == 0, result.stderr
    assert_whole(result.stdout, {"KBV-S201", "KBV-S301", "KBV-S501", "warning", "error", "thread_injection",
                                 "timer_patch", "result_cache", "second.py"}, 80)
    assert "a/rather/deep/folder/of/candidates/candidate_with_a_long_name.py" in result.stdout  # relative
    single = kbv("scan", str(one), cwd=Path("/"))
    assert_whole(single.stdout, {"KBV-S301", "timer_patch"}, 80)
    assert "candidate_with_a_long_name.py" in single.stdout


def test_piped_report_at_80_columns(sample_run: Path) -> None:
    result = kbv("report", str(sample_run), columns=80)
    assert result.returncode == 0, result.stderr
    words = {v.status.value for v in SAMPLE} | {c.value for v in SAMPLE for c in v.categories}
    assert_whole(result.stdout, words | {"fast_1.5", "geomean", "0.0031x"}, 80)
    board = kbv("report", str(sample_run), "--by", "model", columns=80)
    assert_whole(board.stdout, {"model-a", "model-b", "geomean"}, 80)


def test_piped_report_without_columns_is_160_wide_with_whys(sample_run: Path) -> None:
    out = kbv("report", str(sample_run)).stdout
    assert max(len(line) for line in out.splitlines()) <= 160 and "why" in out


@pytest.mark.slow
def test_piped_eval_at_80_columns(tmp_path: Path, relu_problems: Path, cache_dir: Path) -> None:
    """A real (standard-protocol, CPU) evaluation of a wrong candidate with a long name."""
    cands = write_tree(tmp_path / "c", {"19_ReLU__absolute_value_instead_of_relu_for_everything.py": WRONG_RELU})
    result = kbv("eval", str(cands), "--problems", str(relu_problems), "--device", "cpu", "--run",
                 str(tmp_path / "run"), "--cache-dir", str(cache_dir), "--timeout", "120", columns=80)
    assert result.returncode == 0, result.stderr
    assert_whole(result.stdout, {"incorrect", "value_mismatch", "standard", "fast_1", "geomean"}, 80)
