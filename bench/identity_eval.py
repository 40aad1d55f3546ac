"""Identity candidates through a whole `kbv eval` under the verified protocol, with and without the
run's own background work (bench for issue 37: identities that time at 0.3-1.7 in a run, where the
same children timed alone by bench/identity_children.py agree within 3%).

Each identity candidate (the problem's `Model` renamed `ModelNew`) is evaluated `--runs` times per
variant, each run in a fresh run directory (nothing resumed), timed through the bench-only
`time_unattributed` setting. The variants change only what the lane does beside the pair it times:

- `default`: as a run has it: children started ahead (`PRESTART`) and spare reference children
  (`SPARES`) coming up while earlier pairs are evaluated;
- `quiet`: neither: each child is started when its pair's turn comes, nothing else of ours runs;
- `lane`: as `default`, but the children a lane times spread over all of its CPUs
  (`kbv.placement.CHILD_CPUS` = 0), where by default the candidate and its baselines share one;
- `no-aslr`: as `default`, with address-space layout randomisation off in every child (Linux's
  personality flag: `kbv.sandbox.parent.CHILD_ASLR`). Two alike children have timed a launch-bound call
  15% apart; where that comes from each process's own layout of the interpreter, torch and their heaps,
  the identities of this variant agree with 1.00 run after run and those of `default` do not.

Per variant and problem: every run's speedup against the live TF32 baseline (1.00 is the truth), its
interval, and the candidate's and the baseline's medians and spreads. Prints a table; `--out` writes JSON.

    PYTHONPATH=src python3 bench/identity_eval.py --device cuda --runs 3 --variants default,quiet
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import kbv.executors.local as local
import kbv.placement as placement
import kbv.sandbox.parent as sandbox_parent
from kbv.api import EvalConfig, evaluate
from kbv.problems import find_problem, load_problems

# variant -> (children started ahead, spare reference children, CPUs the lane's children share)
VARIANTS = {"default": (local.PRESTART, local.SPARES, placement.CHILD_CPUS), "quiet": (0, 0, placement.CHILD_CPUS),
            "lane": (local.PRESTART, local.SPARES, 0),
            "no-aslr": (local.PRESTART, local.SPARES, placement.CHILD_CPUS)}
NO_ASLR = {"no-aslr"}  # the children start with address-space layout randomisation off


def write_identities(problems: Any, keys: list[str], into: Path) -> None:
    for key in keys:
        problem = find_problem(problems, key)
        (into / f"{problem.name}__identity.py").write_text(re.sub(r"\bModel\b", "ModelNew", problem.code))


def one_run(cands: Path, problems: str, device: str, run_dir: Path, cache_dir: Path, seed: int,
            budget: float) -> list[dict[str, Any]]:
    result = evaluate(EvalConfig(candidates=str(cands), problems=problems, protocol="verified", device=device,
                                 run_dir=str(run_dir), cache_dir=str(cache_dir), seed=seed, trials=1,
                                 timer_budget_s=budget, time_unattributed=True))
    rows = []
    for v in result.verdicts:
        t = v.timing
        row: dict[str, Any] = {"problem": v.problem, "status": v.status.value}
        if t is not None:
            base = t.baselines.get("eager-tf32")
            row.update(speedup=t.speedups.get("eager-tf32"), ci=list(t.speedup_ci.get("eager-tf32", ())),
                       candidate_ms=t.candidate.median_ms, candidate_std_ms=t.candidate.std_ms,
                       baseline_ms=base.median_ms if base else None, baseline_std_ms=base.std_ms if base else None)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--problems", default="smoke")
    ap.add_argument("--only", default="L1/2_ReLU,L1/6_Softmax,L3/1_MLP")
    ap.add_argument("--variants", default="default,quiet", help="which of: " + ", ".join(VARIANTS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timer-budget", type=float, default=4.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: expected some of {', '.join(VARIANTS)}")
    if args.runs < 1:
        ap.error("--runs: expected at least 1")
    keys = [k for k in args.only.split(",") if k]
    if NO_ASLR & set(variants) and not sys.platform.startswith("linux"):
        ap.error("--variants no-aslr: Linux only")
    rows: list[dict[str, Any]] = []
    print(f"{'variant':8s} {'run':>3s} {'problem':16s} {'speedup':>8s} {'interval':>17s} "
          f"{'cand us':>8s} {'sd':>7s} {'base us':>8s} {'sd':>7s}")
    with tempfile.TemporaryDirectory(prefix="kbv-identity-eval-") as tmp:
        root = Path(tmp)
        cands = root / "candidates"
        cands.mkdir()
        write_identities(load_problems(args.problems), keys, cands)
        for run in range(args.runs):
            for variant in variants:  # alternated, run by run: drift in the machine touches both alike
                local.PRESTART, local.SPARES, placement.CHILD_CPUS = VARIANTS[variant]
                sandbox_parent.CHILD_ASLR = variant not in NO_ASLR
                got = one_run(cands, args.problems, args.device, root / f"{variant}-{run}", root / "cache",
                              11 + run, args.timer_budget)
                for r in got:
                    rows.append({"variant": variant, "run": run, **r})
                    sp, ci = r.get("speedup"), r.get("ci") or []
                    us = [r.get(k) for k in ("candidate_ms", "candidate_std_ms", "baseline_ms", "baseline_std_ms")]
                    print(f"{variant:8s} {run:3d} {r['problem'][:16]:16s} "
                          f"{'-' if sp is None else f'{sp:.3f}':>8s} "
                          f"{(f'[{ci[0]:.3f}, {ci[1]:.3f}]' if len(ci) == 2 else '-'):>17s} "
                          + " ".join(f"{'-' if x is None else f'{x * 1e3:.1f}':>{w}s}"
                                     for x, w in zip(us, (8, 7, 8, 7))), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
