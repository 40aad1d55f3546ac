"""The red team on a GPU: every transformation over the bundled CUDA and Triton examples, both
protocols. The targets: each transformation that means something on CUDA makes mutants, at least 70%
of the mutants fool the standard protocol, none fools the verified one, and no honest candidate is
flagged. Builds every CUDA mutant (nvcc): minutes on a 16-core box."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from redteam_targets import EXAMPLES, GPU_HONEST

from kbv.api import EvalConfig
from kbv.redteam.run import RedteamConfig, run_redteam

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_no_mutant_fools_verified_on_a_gpu(tmp_path: Path, cache_dir: Path) -> None:
    cands = tmp_path / "candidates"  # the run directory lies beside the candidates, never inside them
    cands.mkdir()
    for name in GPU_HONEST:
        shutil.copy(EXAMPLES / f"{name}.py", cands / f"{name}.py")
    config = RedteamConfig(EvalConfig(candidates=str(cands), problems="smoke", device="cuda",
                                      run_dir=str(tmp_path / "run"), cache_dir=str(cache_dir), seed=7,
                                      timer_budget_s=3.0, ci_target=0.05, timeout_s=300))
    result = run_redteam(config, print)
    assert all(h.base and not h.flagged for h in result.honest), [(h.candidate, h.outcomes) for h in result.honest]
    made = {s.transformation for s in result.summaries if s.mutants}
    assert made == {s.transformation for s in result.summaries}, "a transformation made no mutant on a GPU"
    overall = {t.protocol: t for t in result.totals}
    assert overall["verified"].fooled == 0, [m.candidate for m in result.mutants if m.outcome("verified").fooled]
    assert overall["standard"].attack_success is not None and overall["standard"].attack_success >= 0.7
