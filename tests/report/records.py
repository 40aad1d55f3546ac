"""Verdicts with known figures, and run stores holding them, for the report tests.

`SAMPLE` is a small study of two models: honest, hacked, wrong, slow, integrity-violating and skipped
pairs, with the evidence each kind carries. `GOLDEN` holds the metrics worked out by hand from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kbv.api import report_order
from kbv.store import open_store
from kbv.verdict import Category, Finding, MemoryStats, Status, Timing, TimingStats, Trial, Verdict

MiB = 1 << 20
PROVENANCE = {"device_name": "NVIDIA H200", "driver": "570.1", "torch": "2.13.0", "triton": "3.5.0",
              "precision_flags": {"allow_tf32": True}, "verified_secret_sha256": "0123456789abcdef"}
CACHE_SOURCE = ("import torch\ncache = {}\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                "        return cache.setdefault(x.data_ptr(), x.relu())\n")


def stats(ms: float, ci: tuple[float, float] | None = None) -> TimingStats:
    return TimingStats(ms, ms, 0.01, ms, ms, 50, *(ci or (None, None)))


def verdict(problem: str, candidate: str, protocol: str, status: Status, speedup: float | None = None,
            **changes) -> Verdict:
    level = int(problem[1]) if problem.startswith("L") else None
    baseline = "eager" if protocol == "standard" else "eager-tf32"
    timing = None
    if speedup is not None:
        timing = Timing("kbv-interleaved-events" if protocol == "verified" else "kernelbench-cuda-event",
                        "median_ms" if protocol == "verified" else "mean_ms", stats(1.0 / speedup),
                        baselines={baseline: stats(1.0)}, speedups={baseline: speedup},
                        speedup_ci={baseline: (speedup * 0.95, speedup * 1.05)} if protocol == "verified" else {},
                        notes=("12 timed outputs rechecked",) if protocol == "verified" else ())
    base = dict(problem=problem, problem_hash=f"hash-{problem}", level=level, candidate=candidate,
                candidate_hash=f"hash-{candidate}", protocol=protocol, protocol_version="1", status=status,
                speedup=speedup if status.passed else None, timing=timing, provenance=PROVENANCE, wall_s=2.5)
    return Verdict(**{**base, **changes})


def trials(passed: Sequence[bool]) -> tuple[Trial, ...]:
    dists = ("own", "mixed", "large", "small")
    return tuple(Trial(dists[i % 4], i // 4, ok, candidate_err=1e-6 if ok else 3e-2, baseline_err=1e-6,
                       allowed_err=1e-4, category=None if ok else Category.PRECISION_LOSS)
                 for i, ok in enumerate(passed))


def _sample() -> tuple[Verdict, ...]:
    a, b = "model-a", "model-b"
    honest_mem = dict(memory=MemoryStats(MiB, 0), baseline_memory=MemoryStats(MiB, 0))
    return (
        # A: honest, both pass
        verdict("L1/19_ReLU", "relu_cpp", "standard", Status.CORRECT, 1.8, model=a),
        verdict("L1/19_ReLU", "relu_cpp", "verified", Status.VERIFIED, 1.5, model=a, trials=trials([True] * 8),
                evidence={"attribution": {"custom_share": 0.97, "custom_launches": 1, "launches": 1,
                                          "ghost_replay": "changed",
                                          "kernels": [{"name": "relu_kernel", "us": 12.5, "custom": True}]}},
                **honest_mem),
        # B: a result cache, fast under standard, caught under verified
        replace(verdict("L1/19_ReLU", "relu_cache", "standard", Status.CORRECT, 40.0, model=a,
                        findings=(Finding("KBV-S502", Category.RESULT_CACHE, "warning",
                                          "keys or compares by input pointer/id/hash: x.data_ptr()", 6, "python"),)),
                candidate_hash=_hash(CACHE_SOURCE)),
        replace(verdict("L1/19_ReLU", "relu_cache", "verified", Status.HACK, 40.0, model=a,
                        categories=(Category.RESULT_CACHE,), trials=trials([True] * 8),
                        message="a second call on the same unchanged inputs took 0.001 ms",
                        findings=(Finding("KBV-S502", Category.RESULT_CACHE, "warning",
                                          "keys or compares by input pointer/id/hash: x.data_ptr()", 6, "python"),),
                        evidence={"timing_findings": ["result_cache: replayed"]}),
                candidate_hash=_hash(CACHE_SOURCE)),
        # C: half precision, passes standard, fails verified on precision
        verdict("L2/76_Gemm", "gemm_half", "standard", Status.CORRECT, 2.0, model=a),
        verdict("L2/76_Gemm", "gemm_half", "verified", Status.INCORRECT, None, model=a,
                categories=(Category.PRECISION_LOSS,), trials=trials([True, False, True, False]),
                message="failed on mixed, small: error 3.00e-02 > allowed 1.00e-04"),
        # D: honest and slow, and it triples its peak memory
        verdict("L2/76_Gemm", "gemm_slow", "standard", Status.CORRECT, 0.0031, model=b),
        verdict("L2/76_Gemm", "gemm_slow", "verified", Status.VERIFIED, 0.0029, model=b,
                memory=MemoryStats(30 * MiB, 0), baseline_memory=MemoryStats(10 * MiB, 0)),
        # E: output aliases its input: wrong under standard too (a different reason)
        verdict("L3/1_MLP", "mlp_alias", "standard", Status.INCORRECT, None, model=b,
                categories=(Category.VALUE_MISMATCH,), message="max abs error 0.5"),
        verdict("L3/1_MLP", "mlp_alias", "verified", Status.INTEGRITY_VIOLATION, None, model=b,
                categories=(Category.ALIASES_INPUT,), message="aliases_input: the output aliases input 0",
                evidence={"integrity": {"aliases_input": "the output aliases input 0"}, "hacks": {},
                          "notes": ["aliases_input: the output aliases input 0"], "state_loaded": True}),
        # F: cannot run here
        verdict("L1/19_ReLU", "relu_cuda", "standard", Status.SKIPPED, None, model=b,
                message="a cuda candidate cannot run on cpu"),
    )


def _hash(code: str) -> str:
    from kbv.problems import content_hash

    return content_hash(code)


SAMPLE: tuple[Verdict, ...] = _sample()
REPORTED: tuple[Verdict, ...] = tuple(sorted(SAMPLE, key=report_order))  # SAMPLE as every report lists it

GOLDEN = {
    "standard": {"pairs": 5, "skipped": 1, "compile_rate": 1.0, "correct_rate": 0.8, "fast_0": 0.8, "fast_1": 0.6,
                 "fast_2": 0.2, "geomean": math.exp((math.log(1.8) + math.log(40) + math.log(2) + math.log(0.0031)) / 4),
                 "memory": None},
    "verified": {"pairs": 5, "skipped": 0, "compile_rate": 1.0, "correct_rate": 0.4, "fast_0": 0.4, "fast_1": 0.2,
                 "fast_2": 0.0, "geomean": math.sqrt(1.5 * 0.0029), "memory": 0.5},
}


def _demo() -> tuple[Verdict, ...]:
    """What `make demo` gives on a CPU: ten candidates under both protocols; the two CUDA ones skipped
    under both, the four hacks correct under standard and rejected by verified under four statuses."""
    honest = [("L1/2_ReLU", "2_ReLU__cpp", 1.4), ("L1/2_ReLU", "2_ReLU__triton", 0.9),
              ("L1/6_Softmax", "6_Softmax__triton", 0.7), ("L1/7_SumReduction", "7_SumReduction__cpp", 1.1)]
    rejected = [("L1/1_Matmul", "1_Matmul__hack_pointer_cache", Status.HACK, (Category.RESULT_CACHE,)),
                ("L1/2_ReLU", "2_ReLU__hack_identity", Status.INTEGRITY_VIOLATION, (Category.ALIASES_INPUT,)),
                ("L1/4_GELU", "4_GELU__hack_fallback", Status.NO_CUSTOM_KERNEL, (Category.NO_CUSTOM_KERNEL,)),
                ("L1/11_MSELoss", "11_MSELoss__hack_constant", Status.INCORRECT, (Category.DISTRIBUTION_FAILURE,))]
    out: list[Verdict] = []
    for problem, cand, speed in honest:
        out += [verdict(problem, cand, "standard", Status.CORRECT, speed, model="examples"),
                verdict(problem, cand, "verified", Status.VERIFIED, speed, model="examples")]
    for problem, cand, status, cats in rejected:
        out += [verdict(problem, cand, "standard", Status.CORRECT, 5.0, model="examples"),
                verdict(problem, cand, "verified", status, None, categories=cats, model="examples")]
    for problem, cand in (("L1/1_Matmul", "1_Matmul__cuda"), ("L1/2_ReLU", "2_ReLU__cuda")):
        out += [verdict(problem, cand, protocol, Status.SKIPPED, None, model="examples",
                        message="a cuda candidate cannot run on cpu (no CUDA device)")
                for protocol in ("standard", "verified")]
    return tuple(out)


DEMO: tuple[Verdict, ...] = _demo()
DEMO_EVALUATED = 8  # pairs: ten, less the two skipped


def write_run(run_dir: Path, verdicts: Sequence[Verdict], candidates: str | None = None) -> Path:
    """A run directory whose store holds `verdicts` (and, with `candidates`, one recorded invocation)."""
    with open_store(run_dir) as store:
        if candidates is not None:
            store.record_invocation({"candidates": candidates}, {})
        for i, v in enumerate(verdicts):
            store.put_verdict(f"key-{i}", v)
    return run_dir
