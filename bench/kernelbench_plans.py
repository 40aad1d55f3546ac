"""What each problem's memory plan would be on a machine of a given size, without a GPU: nothing runs.

Every problem's footprint is traced on the meta device (`kbv.footprint`), then planned under both
protocols (`kbv.memory_plan`) as if `--device-gib` of device memory and `--host-gib` of host memory were
free: every trial held, the truth held on the device or in host memory, fewer trials held, or refused
with the figures. Before a GPU session it says which problems a sweep will refuse there; for a user
it says which of KernelBench's problems a card can judge under verified.

    PYTHONPATH=src python3 bench/kernelbench_plans.py KERNELBENCH_DIR --device-gib 80 --host-gib 128
    PYTHONPATH=src python3 bench/kernelbench_plans.py KERNELBENCH_DIR --device-gib 141 --only L1/ --out plans.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

TRIALS = 10  # the verified protocol's hidden trials (VerifiedProtocol: 5 distributions x 2)
STANDARD_TRIALS = 5  # the standard protocol's correctness trials (KernelBench's)
POOL_BUDGET = 1 << 30  # the timing pool's default budget (kbv.timing)


def plan_row(problem: Any, device_bytes: int, host_bytes: int) -> dict[str, Any]:
    """One problem's plans under both protocols on a machine with these bytes free."""
    from kbv.footprint import problem_footprint
    from kbv.memory_plan import Available, ProblemTooLarge, plan_standard, plan_verified

    fp = problem_footprint(problem)
    row: dict[str, Any] = {"problem": problem.key}
    if fp is None:
        return {**row, "input_bytes": None, "verified": "unknown footprint", "standard": "unknown footprint",
                "outcome": "unknown"}
    row["input_bytes"], row["truth_bytes"] = fp.input_bytes, fp.truth_bytes
    available = Available(device_bytes, host_bytes)
    try:
        plan = plan_verified(fp, TRIALS, available, POOL_BUDGET, problem.key)
        row["verified"], row["verified_device_bytes"] = plan.describe(), plan.need.device
        row["outcome"] = {"all": "held", "truth": f"truth ({plan.truth_home})", "none": "remade"}[plan.hold.value]
    except ProblemTooLarge as exc:
        row["verified"], row["outcome"] = str(exc).split(": it ", 1)[-1], "refused"
    try:
        std = plan_standard(fp, STANDARD_TRIALS, available, problem.key)
        row["standard"] = f"{std.held} trials held on the {std.home}"
    except ProblemTooLarge as exc:
        row["standard"] = "refused: " + str(exc).split(": it ", 1)[-1]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", help="KernelBench's repository, its problem folder, or any problem tree")
    ap.add_argument("--device-gib", type=float, default=80.0, help="device memory free (GiB)")
    ap.add_argument("--host-gib", type=float, default=128.0, help="host memory available (GiB)")
    ap.add_argument("--only", default="", help="comma-separated substrings of problem keys (L1/, L1/19_)")
    ap.add_argument("--out", default=None, help="write the rows and the counts as JSON here")
    args = ap.parse_args(argv)
    if args.device_gib <= 0 or args.host_gib <= 0:
        ap.error("--device-gib and --host-gib must be positive")
    from kbv.errors import KbvError
    from kbv.footprint import format_bytes
    from kbv.problems import load_problems

    try:
        problems = load_problems(args.problems)
    except KbvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wanted = [w for w in args.only.split(",") if w]
    problems = [p for p in problems if not wanted or any(w in p.key for w in wanted)]
    if not problems:
        print(f"error: no problem of {args.problems} matches --only {args.only}", file=sys.stderr)
        return 2
    rows = [plan_row(p, int(args.device_gib * (1 << 30)), int(args.host_gib * (1 << 30))) for p in problems]
    print(f"{'problem':48s} {'inputs':>8s} {'verified':>13s}  plan")
    for r in rows:
        size = format_bytes(r["input_bytes"]) if r["input_bytes"] is not None else "?"
        print(f"{r['problem'][:48]:48s} {size:>8s} {r['outcome']:>13s}  {r['verified'][:110]}")
    counts = Counter(r["outcome"] for r in rows)
    print(f"\n{len(rows)} problems on {args.device_gib:g} GiB of device memory and {args.host_gib:g} GiB of host "
          "memory, under verified: " + ", ".join(f"{n} {o}" for o, n in counts.most_common())
          + f"; under standard: {sum(1 for r in rows if r['standard'].startswith('refused'))} refused")
    if args.out:
        Path(args.out).write_text(json.dumps({"device_gib": args.device_gib, "host_gib": args.host_gib,
                                              "counts": dict(counts), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
