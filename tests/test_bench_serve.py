"""bench/serve.py's GRPO-shaped load: the step's rollouts are every candidate its own, a group's
kernels are built once, and on a CPU the whole bench runs through a real `kbv serve`, judges as
`kbv eval` does, and a rerun keeps what it measured."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from sources import children_under  # noqa: E402
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


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "bench" / "serve.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_a_rerun_keeps_only_parts_measured_alike_whose_runs_are_still_there(tmp_path: Path) -> None:
    bench = _module()
    runs = {name: tmp_path / name for name in ("run-eval", "run-serve")}
    runs["run-eval"].mkdir()
    out = tmp_path / "serve.json"
    arm = {"pairs": 2, "wall_s": 1.0, "pairs_per_min": 120.0, "segments": [1.0], "complete": True}
    keys = {"eval": "e1", "all": "a1"}
    kept = {"signature": "a1", "eval_signature": "e1", "eval": arm, "eval_run": str(runs["run-eval"]),
            "serve": arm, "serve_run": str(runs["run-serve"]), "disagreements": [], "cached_sequential": {"n": 1}}
    out.write_text(json.dumps(kept))
    assert bench._resumed(str(out), {"eval": "e2", "all": "a1"}) == {}  # other pairs, settings or code
    assert set(bench._resumed(str(out), keys)) == {"eval", "eval_run"}  # the served run is gone
    runs["run-serve"].mkdir()
    assert set(bench._resumed(str(out), keys)) == {"eval", "eval_run", "serve", "serve_run", "disagreements",
                                                   "cached_sequential"}
    # other served settings (a batch size, clients): the eval arm stands, the served side is measured again
    assert set(bench._resumed(str(out), {"eval": "e1", "all": "a2"})) == {"eval", "eval_run"}
    # a segment cut off before it could say how long it ran: its verdicts would count without their time
    out.write_text(json.dumps({**kept, "eval": {**arm, "complete": False, "running": 1.0}}))
    assert bench._resumed(str(out), keys) == {}
    out.write_text(json.dumps(kept))
    runs["run-eval"].rmdir()
    assert bench._resumed(str(out), keys) == {}  # nothing to compare the served verdicts with
    # stopped before kbv eval made its run directory (a slow machine's first 2 s): its time is kept
    out.write_text(json.dumps({**kept, "eval": {**arm, "pairs": 0, "segments": [2.0], "complete": False}}))
    assert set(bench._resumed(str(out), keys)) == {"eval", "eval_run"}
    out.write_text(json.dumps(kept))
    out.write_text("{not json")
    assert bench._resumed(str(out), keys) == {}


def test_a_segmented_eval_arm_is_not_judged_against_the_service() -> None:
    bench = _module()
    cached = {"n": 1, "answers_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0}
    served = {"pairs": 4, "wall_s": 10.0, "pairs_per_min": 24.0, "mode": "1 clients"}
    result = {"load": "grpo", "protocol": "verified", "device": "cpu", "pairs_per_device": 1, "serve": served,
              "cached_sequential": cached, "cached_concurrent": cached, "disagreements": []}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench._print({**result, "eval": {"pairs": 4, "wall_s": 20.0, "pairs_per_min": 12.0, "segments": [8.0, 12.0]}})
        bench._print({**result, "eval": {"pairs": 4, "wall_s": 20.0, "pairs_per_min": 12.0, "segments": [20.0]}})
    first, second = printed.getvalue().split("grpo load")[1:]
    assert "serve >= 0.9x eval pairs/min: not judged" in first and "(2.00x)" in first
    assert "serve >= 0.9x eval pairs/min: met (2.00x)" in second


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(ROOT / "bench" / "serve.py"), *args], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_grpo_step_through_kbv_serve_against_kbv_eval_cut_twice_then_continued_and_kept(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    out, work = tmp_path / "serve.json", tmp_path / "work"
    args = ("--device", "cpu", "--problems", "smoke", "--groups", "1", "--samples", "3", "--cached", "6",
            "--timer-budget", "0.5", "--workdir", str(work), "--out", str(out))
    cut = _bench(*args, "--eval-budget", "2")  # kbv eval is stopped at its budget, before it can finish
    assert cut.returncode == 3, cut.stdout[-3000:] + cut.stderr[-3000:]
    assert "the same command continues it" in cut.stdout and "Traceback" not in cut.stderr
    assert json.loads(out.read_text())["eval"]["complete"] is False

    # SIGTERM (a session's bound) once this segment has stored a verdict (on a slow machine the first
    # segment may have stored one before its budget stopped it): kbv eval stops, its segment is kept
    first = _stored(work)
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "serve.py"), *args], text=True,
                            env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and _stored(work) <= first:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in stderr
    partial = json.loads(out.read_text())["eval"]
    assert partial["complete"] is False and "running" not in partial and len(partial["segments"]) == 2
    assert partial["pairs"] >= 1
    assert not children_under(work), "a child of kbv eval outlived the bench"

    done = _bench(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kept from" in done.stdout and "part of eval" in done.stdout
    data = json.loads(out.read_text())
    assert data["load"] == "grpo" and data["protocol"] == "verified" and data["candidates"] == 3
    assert data["eval"]["complete"] and len(data["eval"]["segments"]) == 3  # every segment's wall time
    assert data["eval"]["wall_s"] == pytest.approx(sum(data["eval"]["segments"]), abs=0.02)
    assert data["eval"]["pairs"] == 3 and data["serve"]["pairs"] == 3
    served = data["serve"]
    assert served["requests"] == 1 and 0 < served["request_p50_s"] <= served["request_max_s"] <= served["wall_s"] + 1
    assert data["disagreements"] == []  # the service judged as the batch run did
    assert data["cached_sequential"]["n"] == 6 and data["cached_concurrent"]["n"] == 6
    assert "same verdicts as kbv eval: yes" in done.stdout and "served >= 30 verified pairs/min" in done.stdout
    assert "not judged" in done.stdout  # an arm of three segments is no fair rate to set the service against

    t0 = time.monotonic()
    again = _bench(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "kept from" in again.stdout and time.monotonic() - t0 < 60
    kept = json.loads(out.read_text())
    assert kept["eval"] == data["eval"] and kept["serve"] == data["serve"]


def _stored(work: Path) -> int:
    """Verdicts the kbv eval arm has stored so far (0 before its run exists)."""
    from kbv.api import load_report

    runs = sorted(work.glob("run-eval*/"))
    try:
        return len(load_report(runs[0]).verdicts) if runs else 0
    except Exception:  # noqa: BLE001 - its store is being made
        return 0
