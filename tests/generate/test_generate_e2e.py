"""End to end: generate against the loopback server, evaluate on CPU with `kbv eval`, report."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kbv.generate.api import read_jsonl
from kbv.problems import load_problems

pytest.importorskip("openai")

PROSE = "Fusing these would need a custom reduction; I will leave it to you."
PREFERRED = ("2_ReLU", "7_SumReduction")  # cheap smoke problems, when the suite has them


def _eval_available() -> bool:
    return importlib.util.find_spec("kbv.api") is not None


def kbv(*args: str, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBV_CACHE_DIR": str(cache_dir)}  # builds stay in the test's own directory
    return subprocess.run([sys.executable, "-m", "kbv", *args], capture_output=True, text=True, timeout=300, env=env)


def smoke_subset(root: Path) -> list[str]:
    """Two smoke problems copied into `root` in the KernelBench layout; their keys."""
    problems = load_problems("smoke")
    chosen = [p for p in problems if p.name in PREFERRED] or problems[:2]
    if not chosen:
        pytest.skip("the smoke suite is empty")
    for p in chosen:
        (root / f"level{p.level}").mkdir(parents=True, exist_ok=True)
        (root / f"level{p.level}" / f"{p.name}.py").write_text(p.code)
    return [p.key for p in chosen]


@pytest.mark.skipif(not _eval_available(), reason="kbv eval is not available (no kbv.api)")
def test_generate_eval_report(tmp_path, chat_server, honest):
    import typer

    from kbv.generate.command import generate_command

    keys = smoke_subset(tmp_path / "problems")
    chat_server.on("e2e-model", honest, PROSE, honest)  # sample 1 of the first problem answers in prose
    app = typer.Typer()
    app.command("generate")(generate_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "generate", "--problems", str(tmp_path / "problems"), "--model", "e2e-model", "--base-url", chat_server.url,
        "--samples", "2", "--concurrency", "1", "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    generated = {(r["problem"], r["sample"]): r["status"] for r in read_jsonl(out / "generations.jsonl")}
    assert sorted(generated) == sorted((k, s) for k in keys for s in (0, 1))
    assert sorted(generated.values()) == ["no_code", "ok", "ok", "ok"]

    run_dir = tmp_path / "run"
    evaluated = kbv("eval", str(out / "generations.jsonl"), "--problems", "smoke", "--device", "cpu",
                    "--run", str(run_dir), cache_dir=tmp_path / "builds")
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    reported = kbv("report", str(run_dir), "--format", "json", cache_dir=tmp_path / "builds")
    assert reported.returncode == 0, reported.stderr
    report = json.loads(reported.stdout)

    verdicts = report["verdicts"]
    assert {(v["problem"], v["sample"]) for v in verdicts} == set(generated)
    for v in verdicts:
        assert v["model"] == "e2e-model"
        if generated[(v["problem"], v["sample"])] == "no_code":
            assert v["status"] == "no_code"  # counted as a failure, not dropped
        else:
            assert v["status"] in ("correct", "verified"), v  # the honest pure-PyTorch answer passes
    assert report["metrics"]
