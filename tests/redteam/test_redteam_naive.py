"""Every transformation's mutants are real hacks: each fools a naive KernelBench-style harness
(`naive_harness.py`: allclose on the problem's own inputs, wall-clock timing), so a transformation
whose mutants kbv catches is a test that could have failed.

The harness runs in one child process (mutants patch clocks and torch): on a CPU, each
transformation's mutants of the bundled Triton examples (no build needed); on a GPU, those of the
transformations that mean something on CUDA only, on the CUDA examples, at the full suite's sizes:
at the smoke suite's, a call is mostly the host's launch path, which a side stream or TF32 does not
shorten (seen on an H100: the deferred mutants timed 1.8x the honest ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from redteam_targets import by_name, mutants

from kbv.problems import find_problem, load_problems
from kbv.redteam import Mutant

HARNESS = Path(__file__).with_name("naive_harness.py")
SRC = Path(__file__).resolve().parents[2] / "src"
CPU_TRITON = ("2_ReLU__triton", "6_Softmax__triton", "8_LayerNorm__triton")
CUDA_ONLY = ("deferred_stream", "timer_cuda_event", "precision_tf32")
GPU_EXAMPLES = ("1_Matmul__cuda", "2_ReLU__cuda", "6_Softmax__triton")


def run_naive(made: list[Mutant], device: str, tmp_path: Path, suite: str | None = None) -> dict[str, dict]:
    """The naive harness's result per mutant file stem, from one child process; with `suite`, each on
    that suite's problem of the same key (its sizes) instead of the one it was made for."""
    jobs = []
    problems = load_problems(suite) if suite else None
    for mutant in made:
        problem = find_problem(problems, mutant.problem.key) if problems is not None else mutant.problem
        path = tmp_path / f"{Path(mutant.honest.name).name}__{mutant.transformation}.py"
        path.write_text(mutant.code)
        jobs.append({"name": path.stem, "problem_code": problem.code, "honest": mutant.honest.origin,
                     "mutant": str(path), "breaks": mutant.breaks.value})
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    spec.write_text(json.dumps({"tolerance": 1e-2, "device": device, "jobs": jobs}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HARNESS), str(spec), str(out)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.read_text())["results"]}


def _assert_all_fooled(results: dict[str, dict]) -> None:
    missed = {name: (r["passed"], r["honest_ms"], r["mutant_ms"], (r["error"] or "")[-600:])
              for name, r in results.items() if not r["fooled"]}
    assert not missed, missed


def test_every_cpu_transformation_fools_a_naive_harness(tmp_path: Path) -> None:
    made = []
    for transformation in by_name().values():
        if "cpu" not in transformation.devices:
            continue
        mine = mutants(transformation, CPU_TRITON, "cpu")
        assert mine, f"{transformation.name} made no mutant of {CPU_TRITON}"
        made.append(mine[0])  # one each keeps it fast; test_redteam_transforms checks every example rewrites
    results = run_naive(made, "cpu", tmp_path)
    assert len(results) == len(made)
    _assert_all_fooled(results)


@pytest.mark.gpu
def test_every_cuda_only_transformation_fools_a_naive_harness_on_a_gpu(tmp_path: Path) -> None:
    made = [m for name in CUDA_ONLY for m in mutants(by_name()[name], GPU_EXAMPLES, "cuda")]
    assert {m.transformation for m in made} == set(CUDA_ONLY)
    _assert_all_fooled(run_naive(made, "cuda", tmp_path, suite="full"))
