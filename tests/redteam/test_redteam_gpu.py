"""The red team on a GPU, a slice that fits a GPU session's tests: the three CUDA-only
transformations and two that fooled standard on every GPU base (an H100, 2026-12-05), over a CUDA and
a Triton example (the CUDA one a matmul), both protocols. None fools the verified protocol, no honest candidate is flagged,
and each transformation makes its mutants. The whole figure (every transformation over every GPU
example, and standard's attack success) is `bench/gpu_session.sh redteam`'s, published in
docs/redteam.md: that run takes about 12 minutes on an H100, past what one test may."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from redteam_targets import EXAMPLES

from kbv.api import EvalConfig
from kbv.redteam.run import RedteamConfig, run_redteam

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SLICE_BASES = ("1_Matmul__cuda", "6_Softmax__triton")  # precision_tf32 needs a matmul
SLICE = ("deferred_stream", "timer_cuda_event", "precision_tf32", "lazy_fill", "reach_clock_gc")


def test_no_mutant_fools_verified_on_a_gpu(tmp_path: Path, cache_dir: Path) -> None:
    cands = tmp_path / "candidates"  # the run directory lies beside the candidates, never inside them
    cands.mkdir()
    for name in SLICE_BASES:
        shutil.copy(EXAMPLES / f"{name}.py", cands / f"{name}.py")
    config = RedteamConfig(EvalConfig(candidates=str(cands), problems="smoke", device="cuda",
                                      run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir), seed=7,
                                      timer_budget_s=3.0, ci_target=0.05, timeout_s=300),
                            transformations=SLICE)
    result = run_redteam(config, print)
    assert all(h.base and not h.flagged for h in result.honest), [(h.candidate, h.outcomes) for h in result.honest]
    made = {s.transformation for s in result.summaries if s.mutants}
    assert made == set(SLICE), "a transformation made no mutant on a GPU"
    overall = {t.protocol: t for t in result.totals}
    assert overall["verified"].fooled == 0, [m.candidate for m in result.mutants if m.outcome("verified").fooled]
