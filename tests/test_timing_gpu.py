"""GPU adversaries of the verified timer and memory figures (issue 4). Marked `gpu`: skipped here.

All candidates compute the same Triton matmul on a 3072^2 fp32 problem, so their real device time is
the honest kernel's; what differs is how they try to look faster (or use memory).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.verdict import Category, Status
from verdict_log import log_verdicts, run_log

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

FIXTURES = Path(__file__).parent / "gpu_fixtures"
KERNEL = (FIXTURES / "honest_triton.py").read_text().split("class ModelNew")[0]
CANDIDATES = ("honest_triton", "side_stream_python", "event_patch", "sync_patch", "stale_after_warmup",
              "alloc_1gib", "raw_cudamalloc", "raw_transient_1gib", "joined_stream")


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("timing_gpu")
    problems = root / "problems" / "level1"
    problems.mkdir(parents=True)
    (problems / "1_Matmul.py").write_text((FIXTURES / "problem_matmul.py").read_text())
    cands = root / "candidates"
    cands.mkdir()
    for name in CANDIDATES:
        src = (FIXTURES / f"{name}.py").read_text()
        src = src.replace("from honest_triton_kernel import matmul\n", KERNEL)
        (cands / f"1_Matmul__{name}.py").write_text(src)
    result = evaluate(EvalConfig(candidates=str(cands), problems=str(root / "problems"), protocol="verified",
                                 device="cuda", run_dir=str(root / "run"), cache_dir=str(cache_dir),
                                 seed=7, timer_budget_s=4.0, ci_target=0.02), **run_log("timing-gpu"))
    log_verdicts(result.verdicts)
    return {v.candidate.split("__")[-1]: v for v in result.verdicts}


def _median(v):
    return v.timing.candidate.median_ms


def test_honest_kernel_is_verified_with_an_interval(verdicts):
    v = verdicts["honest_triton"]
    assert v.status is Status.VERIFIED, v.message
    lo, hi = v.timing.speedup_ci["eager-tf32"]
    assert lo <= v.speedup <= hi


def test_side_stream_is_named_and_not_timed_faster_than_the_honest_kernel(verdicts):
    honest, side = verdicts["honest_triton"], verdicts["side_stream_python"]
    # its inputs written late on the current stream, the private stream computed on poison
    assert Category.SIDE_STREAM in side.categories, side.message
    if side.timing is not None:
        assert _median(side) >= 0.8 * _median(honest)


@pytest.mark.parametrize("name", ["event_patch", "sync_patch"])
def test_patched_timing_primitives_are_caught(verdicts, name):
    v = verdicts[name]
    assert v.status is Status.HACK, v.message
    assert Category.TIMER_PATCH in v.categories


def test_stale_results_after_the_first_calls_fail(verdicts):
    v = verdicts["stale_after_warmup"]
    assert v.status is Status.HACK, v.message
    assert Category.RESULT_CACHE in v.categories


def test_one_gib_scratch_shows_in_peak_memory(verdicts):
    honest, fat = verdicts["honest_triton"], verdicts["alloc_1gib"]
    assert fat.status is Status.VERIFIED, fat.message
    extra = fat.memory.peak_bytes - honest.memory.peak_bytes
    assert abs(extra - (1 << 30)) <= (1 << 20), extra


def test_raw_cudamalloc_shows_at_device_level(verdicts):
    honest, raw = verdicts["honest_triton"], verdicts["raw_cudamalloc"]
    assert raw.memory.device_raw_bytes is not None and honest.memory.device_raw_bytes is not None
    assert raw.memory.device_raw_bytes - honest.memory.device_raw_bytes >= (512 << 20) - (4 << 20)
    assert raw.memory.peak_bytes - honest.memory.peak_bytes < (64 << 20)  # the allocator never saw it


def test_a_raw_workspace_freed_before_return_shows_in_the_device_level_peak(verdicts):
    honest, raw = verdicts["honest_triton"], verdicts["raw_transient_1gib"]
    assert raw.status is Status.VERIFIED, raw.message
    assert raw.memory.device_peak_bytes - honest.memory.device_peak_bytes >= 1 << 30
    assert raw.memory.peak_bytes - honest.memory.peak_bytes < (64 << 20)  # the allocator never saw it


def test_an_honest_kernels_device_level_peak_is_the_baselines(verdicts):
    """Candidate and baseline are measured by the same code in the same kind of child, as the peak
    above the pre-call level during one forward: an honest kernel with the same output comes out alike."""
    for name in ("honest_triton", "joined_stream"):
        v = verdicts[name]
        cand, base = v.memory.device_peak_bytes, v.baseline_memory.device_peak_bytes
        assert cand is not None and base is not None, name
        assert abs(cand - base) <= max(0.05 * base, 16 << 20), (name, cand, base)


def test_stream_joined_through_an_event_is_measured_and_not_flagged(verdicts):
    honest, joined = verdicts["honest_triton"], verdicts["joined_stream"]
    assert joined.status is Status.VERIFIED, joined.message
    assert not any(c in joined.categories for c in (Category.SIDE_STREAM, Category.TIMING_MISMATCH))
    assert 0.8 <= _median(joined) / _median(honest) <= 1.25
