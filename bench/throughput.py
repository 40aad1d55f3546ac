"""Throughput: wall time per pair and per stage, for both protocols. Prints a table; writes JSON.

Cases (`--cases`):
- `full`: the bundled `full` suite with `examples/` (GPU size; on CPU use `smoke`);
- `smoke`: the bundled `smoke` suite with `examples/`;
- `gib`: a ReLU over 1 GiB of fp32 input (`bench/problems/relu_1gib.py`) with the honest CUDA example
  (GPU only).

Each pair's figures come from its verdict's `evidence["stages_s"]` (exclusive seconds per stage, see
`kbv.stages`) and `evidence["pair_s"]` (the pair's wall time in the executor, its problem's preparation
included when it was the first pair of that problem, its build wait excluded).

    PYTHONPATH=src python3 bench/throughput.py --cases full,gib --device cuda --out throughput.json
    PYTHONPATH=src python3 bench/throughput.py --cases smoke --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "full": (str(ROOT / "examples"), "full"),
    "smoke": (str(ROOT / "examples"), "smoke"),
    "gib": (str(ROOT / "examples" / "2_ReLU__cuda.py"), str(ROOT / "bench" / "problems" / "relu_1gib.py")),
}


def run_case(name: str, args: argparse.Namespace, root: Path, done: list[dict[str, Any]]) -> dict[str, Any]:
    """Evaluate one case; every verdict is added to the case record as it is stored (and written to
    `--out`, so a run cut short keeps what finished)."""
    from kbv.api import EvalConfig, evaluate

    candidates, problems = CASES[name]
    config = EvalConfig(candidates=candidates, problems=problems, protocol=args.protocol, device=args.device,
                        run_dir=str(root / f"run-{name}"), cache_dir=args.cache_dir or str(root / "cache"),
                        seed=args.seed, timer_budget_s=args.timer_budget, trials=args.trials,
                        timeout_s=args.timeout)
    t0 = time.monotonic()
    case: dict[str, Any] = {"case": name, "wall_s": 0.0, "pairs": []}
    done.append(case)

    def show(n: int, total: int, v: Any) -> None:
        if v is None:
            return
        print(f"  [{name} {n}/{total}] {v.protocol:8s} {v.problem:26s} {v.candidate:34s} {v.status.value:20s}"
              f" pair {v.evidence.get('pair_s', v.wall_s):6.1f} s", flush=True)
        case["pairs"].append(_pair_record(v))
        case["wall_s"] = round(time.monotonic() - t0, 2)
        _write(args.out, done)

    evaluate(config, progress=show)
    case["wall_s"] = round(time.monotonic() - t0, 2)
    return case


def _write(out: str | None, cases: list[dict[str, Any]]) -> None:
    if out:
        rows = [r for c in cases if c["pairs"] for r in summarise(c)]
        Path(out).write_text(json.dumps({"cases": cases, "summary": rows}, indent=1))


def _pair_record(v: Any) -> dict[str, Any]:
    stages = dict(v.evidence.get("stages_s") or {})
    pair_s = float(v.evidence.get("pair_s") or v.wall_s)
    other = pair_s - sum(s for k, s in stages.items() if k != "build_wait")
    return {"problem": v.problem, "candidate": v.candidate, "protocol": v.protocol, "status": v.status.value,
            "speedup": v.speedup, "pair_s": round(pair_s, 3), "stages_s": stages, "other_s": round(max(other, 0.0), 3)}


def summarise(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Per protocol: pairs, mean and max pair time (build excluded), and mean seconds per stage."""
    from kbv.stages import STAGES

    rows = []
    for protocol in sorted({p["protocol"] for p in case["pairs"]}):
        mine = [p for p in case["pairs"] if p["protocol"] == protocol]
        times = [p["pair_s"] for p in mine]
        stage_means = {s: statistics.fmean(p["stages_s"].get(s, 0.0) for p in mine) for s in STAGES}
        stage_means["other"] = statistics.fmean(p["other_s"] for p in mine)
        rows.append({"case": case["case"], "protocol": protocol, "pairs": len(mine),
                     "mean_pair_s": statistics.fmean(times), "max_pair_s": max(times),
                     "median_pair_s": statistics.median(times), "stages_mean_s": stage_means})
    return rows


def print_table(rows: list[dict[str, Any]], cases: list[dict[str, Any]]) -> None:
    from kbv.stages import STAGES

    cols = [s for s in STAGES + ("other",) if any(r["stages_mean_s"].get(s, 0) >= 0.005 for r in rows)]
    short = {"child_start": "start", "build_wait": "build", "correctness": "correct", "attribution": "attrib",
             "boundary": "bound"}
    head = f"{'case':6s} {'protocol':9s} {'pairs':>5s} {'mean s':>7s} {'med s':>7s} {'max s':>7s} " + \
        " ".join(f"{short.get(c, c)[:7]:>7s}" for c in cols)
    print("\nPer pair (build excluded), and the mean seconds per pair of each stage:")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:6s} {r['protocol']:9s} {r['pairs']:5d} {r['mean_pair_s']:7.2f} {r['median_pair_s']:7.2f} "
              f"{r['max_pair_s']:7.2f} " + " ".join(f"{r['stages_mean_s'].get(c, 0.0):7.2f}" for c in cols))
    for case in cases:
        print(f"{case['case']}: whole run {case['wall_s']:.1f} s")
    ratios = _verified_over_standard(cases)
    if ratios:
        print("\nVerified / standard pair time, same pair:")
        for (case, problem, cand), ratio in ratios.items():
            print(f"  {case:6s} {problem:26s} {cand:34s} {ratio:5.2f}x")


def _verified_over_standard(cases: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    out = {}
    for case in cases:
        by = {(p["problem"], p["candidate"], p["protocol"]): p["pair_s"] for p in case["pairs"]}
        for (problem, cand, protocol), s in by.items():
            std = by.get((problem, cand, "standard"))
            if protocol == "verified" and std:
                out[(case["case"], problem, cand)] = s / std
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="full,gib", help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--protocol", default="both")
    ap.add_argument("--timer-budget", type=float, default=4.0)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}: expected {', '.join(CASES)}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="kbv-throughput-"))
    cases: list[dict[str, Any]] = []
    for name in names:
        run_case(name, args, root, cases)
        _write(args.out, cases)
    print_table([r for c in cases if c["pairs"] for r in summarise(c)], cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
