"""Preparation, side by side: the examples' pairs evaluated R times each way, alternating, in one
process, builds cached after a first warm-up run. `--compare` picks the two ways:
- `spares`: spare reference children (`kbv.executors.local.SPARES`) against none;
- `findings`: the calibration and soundness findings kept from the run before (the same secret,
  `--seed`; `kbv.protocols.verified.findings`) against an emptied findings cache (verified only);
- `builds`: the reference's last build kept for its seed's next (`kbv.reference.Reference.build`)
  against every build made from the problem's own code (verified only).
Per run: wall seconds, the `prepare` stage's seconds per prepared problem, and the statuses (which must
not change). Prints a table; writes JSON.

    PYTHONPATH=src python3 bench/prepare.py --device cpu --rounds 2
    PYTHONPATH=src python3 bench/prepare.py --device cpu --compare findings --protocol verified
    PYTHONPATH=src python3 bench/prepare.py --device cuda --problems full --compare builds --protocol verified
    PYTHONPATH=src python3 bench/prepare.py --device cuda --problems full --protocol both --out spares.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--problems", default="smoke")
    ap.add_argument("--protocol", default="standard")
    ap.add_argument("--rounds", type=int, default=2, help="runs each way, alternating (after one warm-up run)")
    ap.add_argument("--timer-budget", type=float, default=1.0)
    ap.add_argument("--compare", default="spares", choices=("spares", "findings", "builds"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.compare in ("findings", "builds") and args.protocol == "standard":
        ap.error(f"--compare {args.compare} needs --protocol verified or both: the standard protocol has neither")

    import kbv.executors.local as local
    from kbv.reference import Reference
    from kbv.api import EvalConfig, evaluate

    work = Path(tempfile.mkdtemp(prefix="kbv-prepare-"))
    cands = work / "candidates"
    cands.mkdir()
    for f in sorted((ROOT / "examples").glob("*.py")):
        if args.device == "cpu" and "cuda" in f.name:
            continue  # skipped on a CPU: no pair to prepare
        shutil.copy(f, cands / f.name)
    runs: list[dict[str, Any]] = []
    ways = {"spares": (f"spares={local.SPARES}", "spares=0"), "findings": ("kept", "cleared"),
            "builds": ("copied", "rebuilt")}[args.compare]
    keeping = Reference.build
    order = [ways[0]] + [w for _ in range(args.rounds) for w in (ways[1], ways[0])]
    default_spares = local.SPARES
    for i, way in enumerate(order):
        local.SPARES = 0 if way == "spares=0" else default_spares
        Reference.build = Reference._build if way == "rebuilt" else keeping  # type: ignore[method-assign]
        if way == "cleared" or args.compare == "builds":  # builds: each run prepares as a first run does
            shutil.rmtree(work / "cache" / "findings", ignore_errors=True)
        t0 = time.monotonic()
        result = evaluate(EvalConfig(candidates=str(cands), problems=args.problems, protocol=args.protocol,
                                     device=args.device, seed=7, timer_budget_s=args.timer_budget,
                                     run_dir=str(work / f"run{i}"), cache_dir=str(work / "cache")))
        prepare = [v.evidence.get("stages_s", {}).get("prepare", 0.0) for v in result.verdicts]
        prepared = [p for p in prepare if p > 0]
        runs.append({"way": way, "warm_up": i == 0, "wall_s": round(time.monotonic() - t0, 2),
                     "problems_prepared": len(prepared), "prepare_s": round(sum(prepared), 2),
                     "statuses": sorted(f"{v.candidate} {v.protocol} {v.status.value}" for v in result.verdicts)})
    return report(runs, args.out)


def report(runs: list[dict[str, Any]], out: str | None) -> int:
    print(f"{'run':>4} {'way':>9} {'wall s':>8} {'prepared':>8} {'prepare s/problem':>18}")
    for i, r in enumerate(runs):
        each = r["prepare_s"] / max(r["problems_prepared"], 1)
        print(f"{i:>4} {r['way']:>9} {r['wall_s']:>8.1f} {r['problems_prepared']:>8} {each:>18.2f}"
              + ("   (warm-up: builds)" if r["warm_up"] else ""))
    timed = [r for r in runs if not r["warm_up"]]
    for way in sorted({r["way"] for r in timed}):
        mine = [r for r in timed if r["way"] == way]
        print(f"{way}: median wall {statistics.median(r['wall_s'] for r in mine):.1f} s, "
              f"prepare {statistics.median(r['prepare_s'] / max(r['problems_prepared'], 1) for r in mine):.2f} s a problem")
    same = len({tuple(r["statuses"]) for r in runs}) == 1
    print("statuses: the same in every run" if same else "statuses DIFFER between runs")
    if out:
        Path(out).write_text(json.dumps({"runs": runs}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
