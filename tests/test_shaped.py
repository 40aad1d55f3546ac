"""Honest kernels shaped like real problems, where our own small fixtures hid false positives: weights
larger than one set of inputs and outputs (most of KernelBench's levels 2 and 3), BatchNorm in
training mode (KernelBench never calls eval(): the reference updates its running statistics every
call), a small convolutional network, and a degenerate problem whose every output is 1.

`tests/corpus/shaped/problems/` holds the problems (our own, in KernelBench's format, with `# kbv:
smoke=` sizes); `cpu/` the candidates that run on a CPU and a GPU alike (Triton, library calls),
`gpu/` the CUDA ones. The CPU test runs the problems at their smoke sizes; the GPU test at full size,
where the weights outweigh the inputs (the CUDA-only `retained_state` false positive needed both).
Each candidate's header says what a correct evaluator says (tests/corpus/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.suite import smoke_source
from kbv.verdict import Verdict
from test_corpus import Fixture, check_fixture, read_fixture
from verdict_log import log_verdicts, run_log

SHAPED = Path(__file__).parent / "corpus" / "shaped"
CPU_FIXTURES = [read_fixture(p) for p in sorted((SHAPED / "cpu").glob("*.py"))]
GPU_FIXTURES = CPU_FIXTURES + [read_fixture(p) for p in sorted((SHAPED / "gpu").glob("*.py"))]


def write_problems(root: Path, smoke: bool) -> Path:
    """The shaped problems under `root` (KernelBench's layout), at smoke size or as written."""
    for src in sorted((SHAPED / "problems").rglob("*.py")):
        dst = root / src.relative_to(SHAPED / "problems")
        dst.parent.mkdir(parents=True, exist_ok=True)
        code = src.read_text(encoding="utf-8")
        dst.write_text(smoke_source(code) if smoke else code, encoding="utf-8")
    return root


def run_shaped(kinds: tuple[str, ...], device: str, tmp_path_factory: pytest.TempPathFactory,
               cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    problems = write_problems(tmp_path_factory.mktemp("shaped-problems"), smoke=device == "cpu")
    cands = tmp_path_factory.mktemp("shaped-candidates")
    for kind in kinds:
        for src in (SHAPED / kind).glob("*.py"):
            (cands / src.name).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(problems), protocol="both", device=device,
                                 run_dir=str(tmp_path_factory.mktemp(f"shaped-{device}-run")), cache_dir=str(cache_dir),
                                 timeout_s=300, timer_budget_s=3.0, ci_target=0.05, seed=4321),
                      **run_log(f"shaped-{device}"))
    log_verdicts(result.verdicts)
    assert not result.unpaired, [f"{u.candidate.origin}: {u.reason}" for u in result.unpaired]
    assert not result.problem_failures, result.problem_failures
    return {(v.candidate, v.protocol): v for v in result.verdicts}


@pytest.fixture(scope="session")
def shaped_cpu_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    return run_shaped(("cpu",), "cpu", tmp_path_factory, cache_dir)


@pytest.fixture(scope="session")
def shaped_gpu_verdicts(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[tuple[str, str], Verdict]:
    return run_shaped(("cpu", "gpu"), "cuda", tmp_path_factory, cache_dir)


def test_shaped_problems_are_shaped_like_real_ones() -> None:
    """At full size the Linear's weights outweigh one set of its inputs and outputs (what the
    retained-state rule compares with), and the other problems hold BatchNorm layers."""
    import torch

    from kbv.problems import instantiate_problem, load_problems

    problems = {p.name: p for p in load_problems(SHAPED / "problems")}
    module = instantiate_problem(problems["90_Linear_ReLU_wide"])
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        x = module.get_inputs()[0]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    io = (x.numel() + x.shape[0] * module.out_features) * 4
    assert weights > io and weights >= 4096 * 8192 * 4
    for name in ("91_Conv2d_BatchNorm_ReLU", "90_SmallConvNet"):
        assert "BatchNorm2d" in problems[name].code and ".eval()" not in problems[name].code
    for fixture in GPU_FIXTURES:
        assert fixture.name.split("__", 1)[0] in problems, fixture.path


@pytest.mark.slow
@pytest.mark.parametrize("fixture", CPU_FIXTURES, ids=lambda f: f.name)
def test_shaped_cpu_fixture(fixture: Fixture, shaped_cpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, shaped_cpu_verdicts)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("fixture", GPU_FIXTURES, ids=lambda f: f.name)
def test_shaped_gpu_fixture(fixture: Fixture, shaped_gpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    check_fixture(fixture, shaped_gpu_verdicts)


@pytest.mark.slow
def test_weights_made_its_own_way_are_judged_as_built_and_say_so(
        shaped_cpu_verdicts: dict[tuple[str, str], Verdict]) -> None:
    """The prescaled convolution is verified on its own weights, and its evidence says why: loading
    the reference's weights into it failed, so it was judged as built under each trial's seed."""
    verdict = shaped_cpu_verdicts[("93_Conv2d_Divide_ReLU__triton_prescaled", "verified")]
    notes = " ".join(verdict.evidence.get("notes", []))
    assert "made its own way at construction" in notes and "value_mismatch" in notes, notes
    assert verdict.evidence.get("state_loaded") is False
    honest = shaped_cpu_verdicts[("91_Conv2d_BatchNorm_ReLU__triton", "verified")]
    assert "made its own way" not in " ".join(honest.evidence.get("notes", []))  # the same weights: loaded
