"""An identity candidate (the problem's own `Model`, renamed `ModelNew`) runs the very ops its
baseline runs: under the verified protocol it must time at 1.00 (issue 37). On launch-bound problems
the figure is mostly the host's launch path, so whatever the candidate's child does around a timed
call that the baseline's child does not (a profiler left attached by its attribution, a guard, a
wrapper) shows here first. Marked `gpu`: skipped without CUDA. bench/repeat.py measures the same
across runs.

One run cannot hold every identity to 1.00 +- 0.05: on an H100 (docs/gpu/2026-12-07) four alike reference
children of L1/2_ReLU, every block at the boost clock, came out up to 1.21x apart once the window's
31 us of costs were taken out of their 39 us windows, each child's offset steady over 14 rounds. So a
launch-bound identity may stand outside +-0.05 where its interval, which holds what alike processes differ
by (`kbv.protocols.verified.spread.process_spread`), holds 1.00; and that interval must still say something."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbv.api import EvalConfig, evaluate
from kbv.problems import find_problem, load_problems
from verdict_log import log_verdicts, run_log

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

IDENTITY = ("L1/2_ReLU", "L1/6_Softmax", "L3/1_MLP")  # microseconds a call at the smoke suite's sizes
# 1.00 +- 0.03 is the target over runs (bench/repeat.py); one run's figure is allowed its interval on top
WITHIN = 0.05
SPAN = 2.0  # an interval wider than this (its high end over its low end) says nothing of an identity


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("identity_gpu")
    cands = root / "candidates"
    cands.mkdir()
    problems = load_problems("smoke")
    for key in IDENTITY:
        problem = find_problem(problems, key)
        (cands / f"{problem.name}__identity.py").write_text(re.sub(r"\bModel\b", "ModelNew", problem.code))
    # time_unattributed: an identity is no_custom_kernel, timed all the same for its figures (a bench setting)
    result = evaluate(EvalConfig(candidates=str(cands), problems="smoke", protocol="verified", device="cuda",
                                 run_dir=str(root / "run"), cache_dir=str(cache_dir), seed=11, trials=1,
                                 timer_budget_s=4.0, time_unattributed=True), **run_log("identity-gpu"))
    log_verdicts(result.verdicts)
    return {v.problem: v for v in result.verdicts}


@pytest.mark.parametrize("key", IDENTITY)
def test_an_identity_candidate_times_as_its_baseline(verdicts, key):
    v = verdicts[key]
    assert v.timing is not None, v.message
    speedup = v.timing.speedups.get("eager-tf32")
    assert speedup is not None, v.timing.notes
    ci = (v.timing.speedup_ci or {}).get("eager-tf32")
    base = v.timing.baselines.get("eager-tf32")
    # which side moved, and how far the interval reaches: an H100 gave L1/2_ReLU 0.933, 1.099 and 0.900 in
    # three runs. A string, so that pytest prints it whole (it cuts a dict's repr, the notes with it)
    said = repr({"speedup": round(speedup, 4), "ci": ci, "candidate_ms": round(v.timing.candidate.median_ms, 5),
                 "baseline_ms": round(base.median_ms, 5) if base else None, "notes": v.timing.notes})
    assert ci is not None and ci[1] / ci[0] <= SPAN, said
    assert abs(speedup - 1.0) <= WITHIN or ci[0] <= 1.0 <= ci[1], said
