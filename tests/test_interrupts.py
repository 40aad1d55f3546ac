"""`kbv eval` as a user runs it, off a terminal: one progress line per stored verdict; Ctrl-C or
SIGTERM ends the run within 3 s with every child killed, every finished verdict stored and exit code
130; the same command then resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbv.api import load_report
from sources import SLOW_RELU, children_under, write_tree

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src"
PAIRS = 6


@pytest.fixture
def workspace(tmp_path: Path, relu_problems: Path) -> Path:
    write_tree(tmp_path / "cands", {f"19_ReLU__slow{i}.py": SLOW_RELU + f"# variant {i}\n" for i in range(PAIRS)})
    return tmp_path


def _command(ws: Path, problems: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kbv", "eval", str(ws / "cands"), "--problems", str(problems), "--device", "cpu",
            "--run", str(ws / "run"), "--cache-dir", str(ws / "cache"), "--protocol", "standard", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_run_quickly_keeps_its_verdicts_and_the_rerun_resumes(workspace, relu_problems, signum):
    proc = subprocess.Popen(_command(workspace, relu_problems), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the first stored verdict's progress line
    assert first.startswith(f"[1/{PAIRS}] L1/19_ReLU 19_ReLU__slow"), first
    sent = time.monotonic()
    proc.send_signal(signum)
    rest, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert took < 3.0, f"exited {took:.1f} s after the signal"
    assert "interrupted" in err and "Traceback" not in err
    while children_under(workspace / "run") and time.monotonic() - sent < 3.0:
        time.sleep(0.05)
    assert children_under(workspace / "run") == [], "a child outlived the run by more than 3 s"
    stored = len(load_report(workspace / "run").verdicts)
    assert 1 <= stored < PAIRS
    again = subprocess.run(_command(workspace, relu_problems), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resumed {stored}" in again.stdout
    assert len(load_report(workspace / "run").verdicts) == PAIRS


def test_progress_lines_go_to_stdout_for_tables_and_to_stderr_for_json(workspace, relu_problems):
    table = subprocess.run(_command(workspace, relu_problems) + ["--jobs", "1"], env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    lines = [ln for ln in table.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == PAIRS
    for i, line in enumerate(lines, start=1):
        fields = line.split()
        assert fields[0] == f"[{i}/{PAIRS}]" and fields[1] == "L1/19_ReLU" and fields[3] == "standard"
        assert fields[4] == "correct" and fields[5].endswith("x") and fields[6].endswith("s")
    command = _command(workspace, relu_problems) + ["--format", "json"]
    command[command.index("--run") + 1] = str(workspace / "run-json")
    as_json = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)["verdicts"]) == PAIRS  # stdout stays parseable
    assert len([ln for ln in as_json.stderr.splitlines() if ln.startswith("[")]) == PAIRS
