"""The bundled problem suite: both sizes load, smoke problems run fast and are not degenerate, and
full-size inputs stay within the memory budget."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import torch

from kbv.problems import Problem, instantiate_problem
from kbv.problems import load_suite
from kbv.suite import smoke_source

MARKER = "# kbv: smoke="
FULL_INPUT_LIMIT_BYTES = 7 * 10**9  # the read-bound reductions need ~6 GB to reach 1 ms on an H200
SMOKE_FORWARD_LIMIT_S = 0.5
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"

SMOKE = load_suite("smoke")
FULL = load_suite("full")


def _run(problem: Problem, seed: int) -> torch.Tensor:
    """Build Model and run one forward on freshly drawn inputs, all under `seed`."""
    module = instantiate_problem(problem)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
        with torch.no_grad():
            return model(*inputs)


def _marked_values(code: str) -> list[tuple[str, str]]:
    """(full value, smoke value) of every marked assignment, read off the source text."""
    pairs = []
    for full_line, smoke_line in zip(code.splitlines(), smoke_source(code).splitlines()):
        if MARKER in full_line:
            full_value = full_line.split("=", 1)[1].split("#", 1)[0].strip()
            pairs.append((full_value, smoke_line.split("=", 1)[1].strip()))
    return pairs


def test_suites_hold_the_same_problems_across_levels():
    assert [p.key for p in SMOKE] == [p.key for p in FULL]
    assert len(SMOKE) >= 12
    assert {p.level for p in SMOKE} >= {1, 2, 3}
    assert all(p.suite == "smoke" for p in SMOKE) and all(p.suite == "full" for p in FULL)


@pytest.mark.parametrize("problem", FULL, ids=lambda p: p.key)
def test_every_marked_constant_shrinks_for_smoke(problem: Problem):
    pairs = _marked_values(problem.code)
    assert pairs, f"{problem.key}: no '{MARKER}' marker, so the smoke size is the full size"
    for full_value, smoke_value in pairs:
        assert ast.literal_eval(full_value) != ast.literal_eval(smoke_value), (problem.key, full_value)


@pytest.mark.parametrize("problem", SMOKE, ids=lambda p: p.key)
def test_smoke_forward_is_fast_finite_and_not_constant(problem: Problem):
    start = time.perf_counter()
    out = _run(problem, seed=0)
    elapsed_s = time.perf_counter() - start
    assert elapsed_s < SMOKE_FORWARD_LIMIT_S, f"{problem.key}: smoke forward took {elapsed_s:.2f} s"
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    if out.dim() > 0:
        assert out.std().item() > 0, f"{problem.key}: constant output"


@pytest.mark.parametrize("problem", SMOKE, ids=lambda p: p.key)
def test_smoke_output_depends_on_the_inputs(problem: Problem):
    first, second = _run(problem, seed=1), _run(problem, seed=2)
    assert first.shape == second.shape
    assert not torch.equal(first, second), f"{problem.key}: same output for different inputs"


@pytest.mark.parametrize("problem", FULL, ids=lambda p: p.key)
def test_full_inputs_fit_the_memory_budget(problem: Problem):
    module = instantiate_problem(problem)
    with torch.device("meta"):  # shapes only: nothing is allocated
        inputs = module.get_inputs()
    assert all(t.device.type == "meta" for t in inputs)
    total_bytes = sum(t.numel() * t.element_size() for t in inputs)
    assert total_bytes < FULL_INPUT_LIMIT_BYTES, f"{problem.key}: {total_bytes / 1e9:.2f} GB of inputs"


def test_smoke_inputs_are_cpu_float32():
    # KernelBench draws inputs on the CPU in fp32; the harness moves and casts them.
    for problem in SMOKE:
        module = instantiate_problem(problem)
        for t in module.get_inputs():
            assert t.device.type == "cpu" and t.dtype == torch.float32, problem.key


@pytest.mark.parametrize("path", sorted(EXAMPLES_DIR.glob("*.py")), ids=lambda p: p.stem)
def test_each_example_pairs_with_a_suite_problem(path: Path):
    problem_name, sep, tag = path.stem.partition("__")
    assert sep and tag, f"{path.name}: expected '<problem stem>__<tag>.py'"
    assert problem_name in {p.name for p in SMOKE}, f"{path.name}: no suite problem named {problem_name}"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
