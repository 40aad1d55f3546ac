"""bench/serve.py's GRPO-shaped load: the step's rollouts are every candidate its own, a group's
kernels are built once, and on a CPU the whole bench runs through a real `kbv serve`, judges as
`kbv eval` does, and a rerun keeps what it measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from templates import GRPO_PROBLEMS, grpo  # noqa: E402


def test_a_grpo_step_is_every_candidate_its_own_and_a_build_per_group_and_kind() -> None:
    step = grpo(8, 16, "cuda")
    assert len(step) == 128 and len({g.code for g in step}) == 128  # nothing a cache could answer
    assert {g.variant.problem for g in step} == set(GRPO_PROBLEMS)
    assert all(sum(g.variant.problem == p for g in step) == 16 for p in GRPO_PROBLEMS)
    kernels = {(g.variant.problem, g.variant.kind): g.salt for g in step}
    assert len({g.salt for g in step}) == len(kernels) <= 16  # a group's kind shares its kernels' salt
    assert not any(g.variant.kind == "cpp" for g in step)
    assert [g.file_name for g in grpo(8, 16, "cuda")] == [g.file_name for g in step]  # a rerun: the same step
    on_cpu = grpo(8, 16, "cpu")
    assert on_cpu and not any(g.variant.needs_gpu for g in on_cpu)
    assert len({g.variant.problem for g in on_cpu}) == len(on_cpu) // 16  # only problems a CPU kind solves


def test_a_rerun_keeps_only_parts_of_the_same_step_whose_runs_are_still_there(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "bench" / "serve.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = {name: tmp_path / name for name in ("run-eval", "run-serve")}
    runs["run-eval"].mkdir()
    out = tmp_path / "serve.json"
    figures = {"pairs": 2, "wall_s": 1.0, "pairs_per_min": 120.0}
    out.write_text(json.dumps({"signature": "abc", "eval": figures, "eval_run": str(runs["run-eval"]),
                               "serve": figures, "serve_run": str(runs["run-serve"]), "disagreements": [],
                               "cached_sequential": {"n": 1}}))
    assert bench._resumed(str(out), "other") == {}  # other candidates or settings: measured afresh
    assert set(bench._resumed(str(out), "abc")) == {"eval", "eval_run"}  # the served run is gone
    runs["run-serve"].mkdir()
    assert set(bench._resumed(str(out), "abc")) == {"eval", "eval_run", "serve", "serve_run", "disagreements",
                                                     "cached_sequential"}
    runs["run-eval"].rmdir()
    assert bench._resumed(str(out), "abc") == {}  # nothing to compare the served verdicts with
    out.write_text("{not json")
    assert bench._resumed(str(out), "abc") == {}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(ROOT / "bench" / "serve.py"), *args], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_grpo_step_through_kbv_serve_against_kbv_eval_resumed_past_its_budget_then_kept(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    out = tmp_path / "serve.json"
    args = ("--device", "cpu", "--problems", "smoke", "--groups", "1", "--samples", "2", "--cached", "6",
            "--timer-budget", "0.5", "--workdir", str(tmp_path / "work"), "--out", str(out))
    cut = _bench(*args, "--eval-budget", "2")  # kbv eval is stopped before it can finish
    assert cut.returncode == 3, cut.stdout[-3000:] + cut.stderr[-3000:]
    assert "the same command continues it" in cut.stdout and "Traceback" not in cut.stderr
    partial = json.loads(out.read_text())["eval"]
    assert partial["complete"] is False and len(partial["segments"]) == 1

    done = _bench(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kept from" in done.stdout and "part of eval" in done.stdout
    data = json.loads(out.read_text())
    assert data["load"] == "grpo" and data["protocol"] == "verified" and data["candidates"] == 2
    assert data["eval"]["complete"] and len(data["eval"]["segments"]) == 2  # both segments' wall time
    assert data["eval"]["wall_s"] == pytest.approx(sum(data["eval"]["segments"]), abs=0.02)
    assert data["eval"]["pairs"] == 2 and data["serve"]["pairs"] == 2
    served = data["serve"]
    assert served["requests"] == 1 and 0 < served["request_p50_s"] <= served["request_max_s"] <= served["wall_s"] + 1
    assert data["disagreements"] == []  # the service judged as the batch run did
    assert data["cached_sequential"]["n"] == 6 and data["cached_concurrent"]["n"] == 6
    assert "same verdicts as kbv eval: yes" in done.stdout and "served >= 30 verified pairs/min" in done.stdout

    t0 = time.monotonic()
    again = _bench(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "kept from" in again.stdout and time.monotonic() - t0 < 60
    kept = json.loads(out.read_text())
    assert kept["eval"] == data["eval"] and kept["serve"] == data["serve"]
