"""`kbv report` end to end: formats, files and where they go, several runs, the leaderboard; bad
input is one line on stderr and exit 2, never a traceback. Golden figures from a run evaluated
through `FakeExecutor`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kbv.api import EvalConfig, evaluate
from kbv.cli import app
from kbv.executors import FakeExecutor, Job
from kbv.verdict import Category, MemoryStats, Status, Verdict
from pagetree import parse
from records import SAMPLE, verdict, write_run
from sources import HONEST_RELU

SRC = Path(__file__).resolve().parents[2] / "src"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def kbv(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kbv", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("where", ["missing", "empty", "a file"])
def test_no_run_there_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    path = tmp_path / "run"
    if where == "empty":
        path.mkdir()
    elif where == "a file":
        path.write_text("not a run")
    for fmt in ("table", "html"):
        result = kbv("report", str(path), "--format", fmt)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and "No kbv run at" in lines[0], result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (path / "report.html").exists() and not (path / "kbv.sqlite").exists()


def test_one_bad_run_among_several_exits_2(sample_run: Path, tmp_path: Path) -> None:
    result = invoke("report", str(sample_run), str(tmp_path / "nope"), "--format", "csv")
    assert result.exit_code == 2 and "nope" in result.stderr


@pytest.mark.parametrize("args, said", [
    (["--format", "pdf"], "Unknown format 'pdf'"),
    (["--by", "problem"], "Unknown --by 'problem'"),
    (["--out", "x.txt"], "--out writes html, csv or parquet"),
])
def test_bad_options_exit_2(sample_run: Path, args: list[str], said: str) -> None:
    result = invoke("report", str(sample_run), *args)
    assert result.exit_code == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_out_naming_a_directory_exits_2(sample_run: Path, tmp_path: Path) -> None:
    result = invoke("report", str(sample_run), "--format", "html", "--out", str(tmp_path))
    assert result.exit_code == 2 and "is a directory" in result.stderr


def test_the_same_run_twice_exits_2(sample_run: Path) -> None:
    result = invoke("report", str(sample_run), str(sample_run) + "/")
    assert result.exit_code == 2 and "named twice" in result.stderr


@pytest.mark.parametrize("fmt, name", [("html", "report.html"), ("csv", "verdicts.csv"), ("parquet", "verdicts.parquet")])
def test_a_file_format_writes_into_the_run_and_prints_the_path(tmp_path: Path, fmt: str, name: str) -> None:
    run = write_run(tmp_path / "run", SAMPLE)
    result = invoke("report", str(run), "--format", fmt)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{(run / name).resolve()}\n" and (run / name).stat().st_size > 0
    assert f"{len(SAMPLE)} verdicts from 1 run" in result.stderr
    out = tmp_path / f"elsewhere.{fmt}"
    assert invoke("report", str(run), "--format", fmt, "--out", str(out)).stdout == f"{out.resolve()}\n"


def test_table_by_model_is_the_leaderboard(sample_run: Path, tmp_path: Path) -> None:
    other = write_run(tmp_path / "other", [verdict("L1/19_ReLU", "z", "standard", Status.CORRECT, 3.0, model="model-z")])
    result = invoke("report", str(sample_run), str(other), "--by", "model")
    assert result.exit_code == 0, result.stderr
    assert "Leaderboard" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "model-" in line]
    assert [r.split("│")[1].strip() for r in rows] == ["model-a", "model-b", "model-z"]  # unverified last


def test_json_of_several_runs(sample_run: Path, tmp_path: Path) -> None:
    other = write_run(tmp_path / "other", SAMPLE[:2])
    single = json.loads(invoke("report", str(sample_run), "--format", "json").stdout)
    assert len(single["verdicts"]) == len(SAMPLE)
    both = json.loads(invoke("report", str(sample_run), str(other), "--format", "json").stdout)
    assert [len(r["verdicts"]) for r in both["runs"]] == [len(SAMPLE), 2]
    lines = invoke("report", str(sample_run), str(other), "--format", "jsonl").stdout.splitlines()
    assert len(lines) == len(SAMPLE) + 2


def test_an_empty_run_reports_without_error(tmp_path: Path) -> None:
    run = write_run(tmp_path / "empty", [])
    for fmt in ("table", "html", "csv"):
        result = invoke("report", str(run), "--format", fmt)
        assert result.exit_code == 0, (fmt, result.stderr)
    assert "0 verdicts from 1 run" in result.stderr


# -- golden figures through the executor's fake --------------------------------------------------

CANDIDATES = {  # candidate stem -> (standard, verified) outcome
    "19_ReLU__fast": ((Status.CORRECT, 4.0), (Status.VERIFIED, 2.0)),
    "19_ReLU__even": ((Status.CORRECT, 1.0), (Status.VERIFIED, 0.5)),
    "19_ReLU__cheat": ((Status.CORRECT, 100.0), (Status.HACK, None)),
    "19_ReLU__wrong": ((Status.INCORRECT, None), (Status.INCORRECT, None)),
}


def answer(job: Job) -> Verdict:
    p, c = job.pair.problem, job.pair.candidate
    status, speed = CANDIDATES[c.name][job.protocol == "verified"]
    cats = {Status.HACK: (Category.TIMER_PATCH,), Status.INCORRECT: (Category.VALUE_MISMATCH,)}.get(status, ())
    memory = {}
    if job.protocol == "verified" and status.passed:
        peak = 8 << 20 if c.name.endswith("fast") else 1 << 20  # the fast one takes 8x the memory
        memory = dict(memory=MemoryStats(peak, 0), baseline_memory=MemoryStats(1 << 20, 0))
    v = verdict(p.key, c.name, job.protocol, status, speed, categories=cats, model=c.model, **memory)
    return Verdict(**{**v.__dict__, "problem_hash": p.hash, "candidate_hash": c.hash, "level": p.level})


def test_golden_figures_of_a_run_through_the_fake_executor(tmp_path: Path, relu_problems: Path) -> None:
    cands = tmp_path / "cands"
    cands.mkdir()
    for i, name in enumerate(CANDIDATES):
        (cands / f"{name}.py").write_text(HONEST_RELU + f"# {i}\n")
    config = EvalConfig(candidates=str(cands), problems=str(relu_problems), protocol="both", device="cpu",
                        run_dir=str(tmp_path / "run"), seed=1)
    fake = FakeExecutor(answer)
    result = evaluate(config, executor=fake)
    assert len(fake.submitted) == 8 and result.evaluated == 8

    written = invoke("report", str(result.run_dir), "--format", "html")
    assert written.exit_code == 0, written.stderr
    page = parse(Path(written.stdout.strip()).read_text())
    table = page.by_id("summary-table")
    cells = {r[0]: r[1:] for r in ([td.text() for td in tr.find_all("td")] for tr in table.find("tbody").find_all("tr"))}
    assert cells["pairs"] == ["4", "4"]
    assert cells["correct rate"] == ["75%", "50%"]
    assert cells["fast_1"] == ["50%", "25%"]  # speedup strictly above 1: 4 and 100 / 2 alone
    assert cells["fast_0.5"] == ["75%", "25%"]
    assert cells["geomean speedup"] == [f"{(4 * 1 * 100) ** (1 / 3):.2f}x (n=3)", f"{math.sqrt(2 * 0.5):.2f}x (n=2)"]
    assert cells["raises peak memory"] == ["-", "50%"]
    hacks = [[td.text() for td in tr.find_all("td")] for tr in page.by_id("hacks").find("tbody").find_all("tr")]
    assert hacks == [["timer_patch", "0", "1"]]
    board = page.by_id("leaderboard-table").find_all("tbody")
    assert [b.find("td").text() for b in board] == ["cands"]  # no model recorded: the candidates' name
    assert len(page.by_id("pairs-table").find_all("tbody", **{"class": "verdict"})) == 8
