"""Throughput: wall time per pair and per stage, for both protocols. Prints a table; writes JSON.

Cases (`--cases`):
- `full`: the bundled `full` suite with `examples/` (GPU size; on CPU use `smoke`);
- `smoke`: the bundled `smoke` suite with `examples/`;
- `gib`: a ReLU over 1 GiB of fp32 input (`bench/problems/relu_1gib.py`) with the honest CUDA example
  (GPU only).

Each pair's figures come from its verdict's `evidence["stages_s"]` (exclusive seconds per stage, see
`kbv.stages`) and `evidence["pair_s"]` (the pair's wall time in the executor, its problem's preparation
included when it was the first pair of that problem, its build wait excluded).

Scale (`--lanes N`, one local lane per GPU, or N CPU lanes on `--device cpu`; `--devices auto|0,1,3`,
lanes as `kbv eval --devices` makes them; `--executor ray`, one Ray task per pair; any of them
together): each case runs on one lane first, then as asked, each from its own run directory with the
builds warmed beforehand (so no run times a build); the table gives pairs per minute of each, their
ratio to one lane, and whether their verdicts are one lane's (statuses, categories, and speedup
intervals that overlap). Under Ray without `--ray-address`, kbv starts a local Ray whose workers share
this script's build cache.

    PYTHONPATH=src python3 bench/throughput.py --cases full,gib --device cuda --out throughput.json
    PYTHONPATH=src python3 bench/throughput.py --cases smoke --device cpu
    PYTHONPATH=src python3 bench/throughput.py --cases full --device cuda --lanes 8
    PYTHONPATH=src python3 bench/throughput.py --cases full --device cuda --executor ray [--ray-address auto]
    PYTHONPATH=src python3 bench/throughput.py --cases full --device cuda --devices auto --one-lane-from one.json
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


def run_case(name: str, args: argparse.Namespace, root: Path, done: list[dict[str, Any]],
             scale: dict[str, Any] | None = None, label: str = "") -> dict[str, Any]:
    """Evaluate one case on one lane (`scale` None), or with `scale`'s EvalConfig fields (devices,
    executor); every verdict is added to the case record as it is stored (and written to `--out`, so a
    run cut short keeps what finished)."""
    from kbv.api import EvalConfig, evaluate

    candidates, problems = args.candidates or CASES[name][0], CASES[name][1]
    tag = label or "one-lane"
    config = EvalConfig(candidates=candidates, problems=problems, protocol=args.protocol,
                        device=args.device if not (scale or {}).get("devices") else "auto",
                        run_dir=str(root / f"run-{name}-{tag}"), cache_dir=_cache_dir(args, root),
                        seed=args.seed, timer_budget_s=args.timer_budget, trials=args.trials,
                        timeout_s=args.timeout, **(scale or {}))
    t0 = time.monotonic()
    case: dict[str, Any] = {"case": name, "scale": tag, "wall_s": 0.0, "pairs": []}
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
    case["pairs_per_min"] = round(60.0 * len(case["pairs"]) / case["wall_s"], 2) if case["wall_s"] > 0 else None
    return case


def _write(out: str | None, cases: list[dict[str, Any]]) -> None:
    if out:
        rows = [r for c in cases if c["pairs"] for r in summarise(c)]
        Path(out).write_text(json.dumps({"cases": cases, "summary": rows, "scale_ratios": scale_ratios(cases),
                                         "agreement": agreement(cases)}, indent=1))


def _cache_dir(args: argparse.Namespace, root: Path) -> str:
    return args.cache_dir or os.environ.get("KBV_CACHE_DIR") or str(root / "cache")


def scale_options(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The scaled runs asked for, each as (label, its EvalConfig fields), in the order they run:
    `--lanes N`, `--devices SPEC`, `--executor ray`. Empty: one lane only."""
    scales = []
    if args.lanes > 1:
        from kbv.settings import resolve_device

        device = resolve_device(args.device)
        devices = ",".join(["cpu"] * args.lanes) if device == "cpu" else ",".join(str(i) for i in range(args.lanes))
        scales.append((f"{args.lanes}-lanes", {"devices": devices}))
    if args.devices:
        scales.append((f"devices-{args.devices.replace(',', '+')}", {"devices": args.devices}))
    if args.executor == "ray":
        scales.append(("ray", {"executor": "ray", "ray_address": args.ray_address}))
    return scales


def warm_builds(name: str, args: argparse.Namespace, root: Path) -> None:
    """Build every compiled candidate of the case into the cache, in parallel (`--jobs`), so that no
    timed run waits for one."""
    from kbv.api import EvalConfig, warm_builds as warm

    warm(EvalConfig(candidates=args.candidates or CASES[name][0], problems=CASES[name][1], device=args.device,
                    jobs=args.jobs, cache_dir=_cache_dir(args, root), run_dir=str(root / "warm")))


def agreement(cases: list[dict[str, Any]]) -> dict[str, list[str]]:
    """'CASE (SCALE)' -> how its verdicts differ from the same case's on one lane: a pair missing on
    either side, another status or categories, or a speedup interval that does not overlap. Empty
    lists: the same verdicts."""
    one = {c["case"]: c for c in cases if c.get("scale", "one-lane") == "one-lane"}
    out: dict[str, list[str]] = {}
    for case in cases:
        base = one.get(case["case"])
        if case.get("scale", "one-lane") == "one-lane" or base is None:
            continue
        mine = {(p["problem"], p["candidate"], p["protocol"]): p for p in case["pairs"]}
        theirs = {(p["problem"], p["candidate"], p["protocol"]): p for p in base["pairs"]}
        diffs = [f"{'/'.join(k)}: only on {'one lane' if k in theirs else case['scale']}"
                 for k in sorted(set(mine) ^ set(theirs))]
        for key in sorted(set(mine) & set(theirs)):
            a, b = theirs[key], mine[key]
            if (a["status"], a.get("categories")) != (b["status"], b.get("categories")):
                diffs.append(f"{'/'.join(key)}: {a['status']} {a.get('categories')} on one lane, "
                             f"{b['status']} {b.get('categories')} here")
            ia, ib = a.get("speedup_ci"), b.get("speedup_ci")
            if ia and ib and (ia[1] < ib[0] or ib[1] < ia[0]):
                diffs.append(f"{'/'.join(key)}: speedup interval {ia[0]:.3f}-{ia[1]:.3f} on one lane, "
                             f"{ib[0]:.3f}-{ib[1]:.3f} here")
        out[f"{case['case']} ({case['scale']})"] = diffs
    return out


def _pair_record(v: Any) -> dict[str, Any]:
    stages = dict(v.evidence.get("stages_s") or {})
    pair_s = float(v.evidence.get("pair_s") or v.wall_s)
    other = pair_s - sum(s for k, s in stages.items() if k != "build_wait")
    ci = None
    if v.timing is not None and v.timing.speedup_ci:
        # the protocol's primary baseline: the one whose speedup is the verdict's
        primary = next((k for k, x in v.timing.speedups.items() if x == v.speedup), None)
        ci = list(v.timing.speedup_ci.get(primary) or next(iter(v.timing.speedup_ci.values())))
    return {"problem": v.problem, "candidate": v.candidate, "protocol": v.protocol, "status": v.status.value,
            "categories": sorted(c.value for c in v.categories), "speedup": v.speedup, "speedup_ci": ci,
            "pair_s": round(pair_s, 3), "stages_s": stages, "other_s": round(max(other, 0.0), 3),
            "message": "" if v.status.value in ("correct", "verified") else v.message[:300],
            "attribution_s": (v.evidence.get("attribution") or {}).get("seconds")}


def summarise(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Per protocol: pairs, mean and max pair time (build excluded), and mean seconds per stage."""
    from kbv.stages import STAGES

    rows = []
    for protocol in sorted({p["protocol"] for p in case["pairs"]}):
        mine = [p for p in case["pairs"] if p["protocol"] == protocol]
        times = [p["pair_s"] for p in mine]
        stage_means = {s: statistics.fmean(p["stages_s"].get(s, 0.0) for p in mine) for s in STAGES}
        stage_means["other"] = statistics.fmean(p["other_s"] for p in mine)
        scale = case.get("scale", "one-lane")
        label = case["case"] if scale == "one-lane" else f"{case['case']}/{scale}"
        rows.append({"case": label, "protocol": protocol, "pairs": len(mine),
                     "mean_pair_s": statistics.fmean(times), "max_pair_s": max(times),
                     "median_pair_s": statistics.median(times), "stages_mean_s": stage_means})
    return rows


def print_table(rows: list[dict[str, Any]], cases: list[dict[str, Any]]) -> None:
    from kbv.stages import STAGES

    cols = [s for s in STAGES + ("other",) if any(r["stages_mean_s"].get(s, 0) >= 0.005 for r in rows)]
    short = {"child_start": "start", "build_wait": "build", "correctness": "correct", "attribution": "attrib",
             "boundary": "bound"}
    head = f"{'case':14s} {'protocol':9s} {'pairs':>5s} {'mean s':>7s} {'med s':>7s} {'max s':>7s} " + \
        " ".join(f"{short.get(c, c)[:7]:>7s}" for c in cols)
    print("\nPer pair (build excluded), and the mean seconds per pair of each stage:")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:14s} {r['protocol']:9s} {r['pairs']:5d} {r['mean_pair_s']:7.2f} {r['median_pair_s']:7.2f} "
              f"{r['max_pair_s']:7.2f} " + " ".join(f"{r['stages_mean_s'].get(c, 0.0):7.2f}" for c in cols))
    for case in cases:
        print(f"{case['case']} ({case.get('scale', 'one-lane')}): whole run {case['wall_s']:.1f} s, "
              f"{case.get('pairs_per_min') or 0:.1f} pairs/min")
    for name, ratio in scale_ratios(cases).items():
        print(f"{name}: {ratio:.2f}x the pairs per minute of one lane")
    for name, diffs in agreement(cases).items():
        print(f"{name}: " + ("the same verdicts as one lane (statuses, categories, speedup intervals)" if not diffs
                             else f"{len(diffs)} difference(s) from one lane:"))
        for d in diffs:
            print(f"    {d}")
    ratios = _verified_over_standard(cases)
    if ratios:
        print("\nVerified / standard pair time, same pair:")
        for (case, problem, cand), ratio in ratios.items():
            print(f"  {case:6s} {problem:26s} {cand:34s} {ratio:5.2f}x")


def scale_ratios(cases: list[dict[str, Any]]) -> dict[str, float]:
    """'CASE (SCALE)' -> its pairs per minute over the same case's on one lane."""
    one = {c["case"]: c.get("pairs_per_min") for c in cases if c.get("scale", "one-lane") == "one-lane"}
    return {f"{c['case']} ({c['scale']})": c["pairs_per_min"] / one[c["case"]] for c in cases
            if c.get("scale", "one-lane") != "one-lane" and one.get(c["case"]) and c.get("pairs_per_min")}


def _verified_over_standard(cases: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    out = {}
    for case in cases:
        if case.get("scale", "one-lane") != "one-lane":
            continue
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
    ap.add_argument("--candidates", default=None, help="evaluate these candidates instead of each case's own")
    ap.add_argument("--lanes", type=int, default=1, help="local lanes: GPUs 0..N-1, or N CPU lanes on --device cpu")
    ap.add_argument("--devices", default=None, help="also run with these local lanes: auto or GPU indices (0,1,3)")
    ap.add_argument("--jobs", type=int, default=0, help="parallel builds when warming the cache (0: one per core, at most 8)")
    ap.add_argument("--warm-only", action="store_true", help="only build the cases' compiled candidates into the cache")
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--ray-address", default=None, help="--executor ray: auto, HOST:PORT or ray://HOST:PORT")
    ap.add_argument("--one-lane-from", default=None,
                    help="with --devices/--lanes/--executor: take the one-lane runs from this earlier --out JSON "
                         "instead of running them again (the same cases, options and build cache)")
    args = ap.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}: expected {', '.join(CASES)}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="kbv-throughput-"))
    # a Ray that kbv starts here runs its workers with this environment: they share the warm cache
    os.environ.setdefault("KBV_CACHE_DIR", _cache_dir(args, root))
    scales = scale_options(args)
    earlier = json.loads(Path(args.one_lane_from).read_text())["cases"] if args.one_lane_from else []
    cases: list[dict[str, Any]] = []
    for name in names:
        t0 = time.monotonic()
        warm_builds(name, args, root)
        if args.warm_only:
            print(f"{name}: builds warm in {_cache_dir(args, root)} ({time.monotonic() - t0:.1f} s)")
            continue
        prior = [c for c in earlier if c["case"] == name and c.get("scale", "one-lane") == "one-lane"
                 and c.get("pairs_per_min")]  # a one-lane run that finished (one cut short has no rate)
        if prior and scales:  # the one-lane run of an earlier invocation is the reference
            cases.append(prior[0])
        else:
            run_case(name, args, root, cases)
        for label, fields in scales:
            run_case(name, args, root, cases, fields, label)
        _write(args.out, cases)
    if cases:
        print_table([r for c in cases if c["pairs"] for r in summarise(c)], cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
