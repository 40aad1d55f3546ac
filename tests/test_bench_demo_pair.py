"""bench/demo_pair.py judges two demos run side by side: an honest example not verified, a hack that
passes, a run whose files name the other run's cache, or a cache with no build, each fails the check
by name; a clean pair passes. (The runs themselves are the device's: `bash bench/gpu_session.sh
demo-pair`.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "demo_pair.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("demo_pair_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    return bench


def _run(tmp: Path, name: str, log: str = "", build: bool = True) -> dict[str, Path]:
    base = tmp / name
    paths = {"checkout": base / "checkout", "cache": base / "cache", "run": base / "run", "log": base / "eval.log"}
    (paths["run"]).mkdir(parents=True)
    (paths["run"] / "kbv.sqlite").write_bytes(b"verdicts")
    paths["log"].write_text(log)
    if build:
        (paths["cache"] / "builds" / "0123abcd").mkdir(parents=True)
    return paths


def _v(candidate: str, protocol: str, status: str) -> dict[str, str]:
    return {"problem": "L1/2_ReLU", "candidate": candidate, "protocol": protocol, "status": status}


GOOD = [_v("2_ReLU__cuda", "standard", "correct"), _v("2_ReLU__cuda", "verified", "verified"),
        _v("2_ReLU__hack_identity", "standard", "correct"), _v("2_ReLU__hack_identity", "verified", "hack")]


def test_a_clean_pair_passes_and_each_failure_is_named(tmp_path: Path) -> None:
    bench = _module()
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    row = bench.check("a", GOOD, a, b["cache"], 0, "cuda")
    assert row["problems"] == [] and row["honest_verified"] == 1 and row["hacks_rejected"] == 1 and row["builds"] == 1

    wrong = [_v("2_ReLU__cuda", "verified", "incorrect"), _v("2_ReLU__hack_identity", "verified", "verified")]
    row = bench.check("a", wrong, a, b["cache"], 0, "cuda")
    assert "honest 2_ReLU__cuda is incorrect" in row["problems"]
    assert "hack 2_ReLU__hack_identity passed verified" in row["problems"]

    leaky = _run(tmp_path, "c", log=f"building in {b['cache']}/builds/0123abcd\n")
    row = bench.check("c", GOOD, leaky, b["cache"], 0, "cuda")
    assert row["problems"] == ["eval.log names the other run's cache"]

    empty = _run(tmp_path, "d", build=False)
    row = bench.check("d", GOOD, empty, b["cache"], 1, "cuda")
    assert row["problems"] == ["kbv eval exited 1", "its cache holds no build"]


def test_a_skipped_example_fails_on_a_gpu_and_is_left_out_on_a_cpu(tmp_path: Path) -> None:
    bench = _module()
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    with_skip = [*GOOD, _v("1_Matmul__cuda", "verified", "skipped")]
    assert bench.check("a", with_skip, a, b["cache"], 0, "cpu")["problems"] == []
    assert "honest 1_Matmul__cuda is skipped" in bench.check("a", with_skip, a, b["cache"], 0, "cuda")["problems"]
