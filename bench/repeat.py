"""Repeatability: the same pairs R times on one machine, each run its own, under both protocols.
Prints a table; writes JSON.

Every run is a fresh process with a fresh run directory (`kbv.api.evaluate`); the first starts on an
empty build cache (cold), the later ones find its builds (warm). Per pair and protocol the table
gives every run's speedup, their max/min, whether each run's 95% interval covers the other runs'
speedups, and how many runs the standard verdict marked `unstable_timing`. The verified interval is
the verdict's own (bootstrap of the ratio of medians); the standard protocol has none, so it gets
the one its figures allow: the ratio of means with a normal interval from the trials' std/sqrt(n)
on each side, which is what a reader of KernelBench's mean and std would compute.

Cases (`--cases`), each a problem set and its pairs:
- `launch`: the smoke suite's sizes, microseconds a call on a GPU: launch-bound, where the standard
  timer races its L2 flush; identity candidates and the examples' GPU kernels;
- `large`: the full suite's sizes, milliseconds a call; identity candidates and GPU kernels;
- `tiny`: one identity pair on the smoke suite (CPU; the bench's own test).
Variants (`--variants`), each a suspect of what moves the numbers, switched off, with its runs
interleaved with the others' (run 0 of every variant, then run 1 of every variant, ...), so that
each cause's effect is measured side by side on one machine; every variant's run 0 is cold:
- `default`: kbv as a user runs it;
- `no-clock-warmup`: the device's clocks are not warmed before each timed window (`--no-warm-clocks`);
- `builds-beside`: builds run as any other process while pairs are timed (`--build-isolation none`).
The closing tables give, per variant and protocol, the median max/min over the pairs and how many
pairs stay within 1.05; then issue 37's targets per variant and case: the verified pairs' worst
max/min, the identities' runs within 1.00 +- 0.03 and those whose interval holds 1.00 (an identity's
true speedup), and the standard pairs that move more than 1.10 with the runs left unmarked by
`unstable_timing` agreeing within it. `--report --out J` prints the tables of J's runs and measures
nothing.

An identity candidate is the problem's own `Model` renamed `ModelNew` (true speedup 1). Under the
verified protocol it is `no_custom_kernel`; the runs set `time_unattributed` (a bench-only setting,
recorded in the verdict and its resume key) so that it is timed all the same, its status unchanged.

Resumable: `--out` holds every (pair, protocol, run) measured; a rerun skips those already there, and a
run with some left evaluates only those (in a fresh run directory again; the pairs a run cut short had
finished are read back from its directory). One `--out` holds one device and one standard timer.

    PYTHONPATH=src python3 bench/repeat.py --device cuda --runs 4 --out repeat.json
    PYTHONPATH=src python3 bench/repeat.py --device cuda --cases launch --standard-timing do_bench
    PYTHONPATH=src python3 bench/repeat.py --device cpu --runs 2 --cases tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
Z95 = 1.96


@dataclass(frozen=True)
class Case:
    problems: str  # a bundled suite or a problem path
    identity: tuple[str, ...]  # problem keys given an identity candidate
    examples: tuple[str, ...] = ()  # candidate files of examples/


CASES = {
    "launch": Case("smoke", ("L1/2_ReLU", "L1/6_Softmax", "L3/1_MLP"),
                   ("2_ReLU__cuda.py", "2_ReLU__triton.py", "6_Softmax__triton.py")),
    "large": Case("full", ("L1/2_ReLU", "L1/1_Matmul"), ("2_ReLU__cuda.py", "1_Matmul__cuda.py")),
    "tiny": Case("smoke", ("L1/2_ReLU",)),
}

# what each variant changes in the run's configuration (`kbv.api.EvalConfig` fields)
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-clock-warmup": {"warm_clocks": False},
    "builds-beside": {"build_isolation": "none"},
}
HOLDS = 1.05  # the verified target's max/min across runs
IDENTITY_WITHIN = 0.03  # an identity's verified speedup: 1.00 +- this
MOVES = 1.10  # a standard pair moving more than this between runs must be marked unstable_timing


# -- the pairs ------------------------------------------------------------------------------------

def identity_source(code: str, key: str) -> str:
    """The problem's own code with `Model` renamed `ModelNew`: the reference as a candidate."""
    head = f"# identity candidate: {key}'s Model, renamed ModelNew (true speedup 1)\n"
    return head + re.sub(r"\bModel\b", "ModelNew", code)


def write_candidates(case: Case, into: Path) -> list[str]:
    """Every candidate of `case` as a file in `into`; their names (file stems)."""
    from kbv.problems import find_problem, load_problems

    into.mkdir(parents=True, exist_ok=True)
    problems = load_problems(case.problems)
    names = []
    for key in case.identity:
        problem = find_problem(problems, key)
        name = f"{problem.name}__identity"
        (into / f"{name}.py").write_text(identity_source(problem.code, problem.key))
        names.append(name)
    for file in case.examples:
        shutil.copy(ROOT / "examples" / file, into / file)
        names.append(file.removesuffix(".py"))
    return names


# -- one run, in its own process -----------------------------------------------------------------

def run_child(spec: dict[str, Any]) -> int:
    """Evaluate `spec`'s candidates in a fresh run directory; write each verdict's record to
    spec["results"]."""
    from kbv.api import EvalConfig, evaluate

    config = EvalConfig(candidates=spec["candidates"], problems=spec["problems"], protocol=spec["protocol"],
                        device=spec["device"], run_dir=spec["run_dir"], cache_dir=spec["cache_dir"],
                        timer_budget_s=spec["timer_budget"], trials=spec["trials"], timeout_s=spec["timeout"],
                        standard_timing=spec["standard_timing"], time_unattributed=True,
                        **VARIANTS[spec.get("variant", "default")])

    records: list[dict[str, Any]] = []

    def show(done: int, total: int, v: Any) -> None:
        if v is None:
            return
        if not hasattr(v, "status"):  # a problem failure (no room on the device...): no verdict to record
            print(f"  [{done}/{total}] {v.protocol:8s} {v.problem:14s} problem failed: {v.message}", flush=True)
            return
        print(f"  [{done}/{total}] {v.protocol:8s} {v.problem:14s} {v.candidate:24s} {v.status.value:16s} "
              f"{_fmt(speedup_of(v))}", flush=True)
        records.append({**record(v), "case": spec["case"], "run": spec["run"],
                        "variant": spec.get("variant", "default")})
        Path(spec["results"]).write_text(json.dumps(records, indent=1))  # a run cut short keeps its pairs

    evaluate(config, progress=show)
    return 0


def speedup_of(v: Any) -> float | None:
    """The verdict's speedup, or for a timed verdict without one (`time_unattributed`), its timing's."""
    from kbv.report.figures import primary_baseline

    if v.speedup is not None:
        return float(v.speedup)
    name = primary_baseline(v)
    said = v.timing.speedups.get(name) if v.timing is not None and name else None
    return float(said) if said is not None else None  # none where the calls were too short to time


def standard_interval(v: Any) -> tuple[float, float] | None:
    """A 95% interval of a ratio of means from each side's std/sqrt(n) (normal, delta method)."""
    from kbv.report.figures import primary_baseline

    s, name = speedup_of(v), primary_baseline(v)
    if s is None or v.timing is None or name is None:
        return None
    cand, base = v.timing.candidate, v.timing.baselines[name]
    if cand.mean_ms <= 0 or base.mean_ms <= 0:
        return None
    rel = math.hypot(cand.std_ms / cand.mean_ms / math.sqrt(cand.n), base.std_ms / base.mean_ms / math.sqrt(base.n))
    return max(0.0, s * (1 - Z95 * rel)), s * (1 + Z95 * rel)


def record(v: Any) -> dict[str, Any]:
    """What the bench keeps of one verdict."""
    from kbv.report.figures import speedup_interval, timed_ms

    interval = speedup_interval(v) if v.protocol == "verified" else standard_interval(v)
    cand_ms, base_ms = timed_ms(v)
    t = v.timing
    return {"problem": v.problem, "candidate": v.candidate, "protocol": v.protocol, "status": v.status.value,
            "categories": [c.value for c in v.categories], "speedup": speedup_of(v),
            "interval": list(interval) if interval else None, "candidate_ms": cand_ms, "baseline_ms": base_ms,
            "candidate_cv": t.candidate.std_ms / t.candidate.mean_ms if t and t.candidate.mean_ms > 0 else None,
            "candidate_host_ms": t.candidate.host_ms if t else None, "flush_ms": v.evidence.get("flush_ms"),
            "method": t.method if t else None, "notes": list(t.notes) if t else [],
            "provenance_timing": v.provenance.get("standard_timing")}


# -- the driver ---------------------------------------------------------------------------------

def load(out: Path) -> dict[str, Any]:
    if out.exists():
        return json.loads(out.read_text())
    return {"runs": [], "results": []}


def save(out: Path, data: dict[str, Any]) -> None:
    data["summary"] = summarise(data["results"])
    data["targets"] = targets(data["summary"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)


def _key(r: dict[str, Any]) -> tuple[str, str, str, str, str, int]:
    return variant_of(r), r["case"], r["problem"], r["candidate"], r["protocol"], int(r["run"])


def variant_of(r: dict[str, Any]) -> str:
    """A record's variant; `legacy` for one made before variants, when no clocks were warmed."""
    return str(r.get("variant", "legacy"))


def merge(data: dict[str, Any], records: list[dict[str, Any]]) -> None:
    have = {_key(r) for r in data["results"]}
    data["results"] += [r for r in records if _key(r) not in have]


def salvage(work: Path, data: dict[str, Any]) -> None:
    """The pairs of runs cut short (the step's time limit), from their run directories."""
    for found in sorted(work.glob("*/*/run-*/results.json")):
        try:
            merge(data, json.loads(found.read_text()))
        except (OSError, ValueError):
            continue  # written as the run was killed: its pairs run again


def missing(data: dict[str, Any], variant: str, case: str, names: list[str], protocols: tuple[str, ...],
            run: int) -> list[str]:
    """The candidates of `case` with no record under some protocol for `run` of `variant`."""
    have = {(r["candidate"], r["protocol"]) for r in data["results"]
            if variant_of(r) == variant and r["case"] == case and int(r["run"]) == run}
    return [n for n in names if any((n, p) not in have for p in protocols)]


def one_run(args: argparse.Namespace, work: Path, variant: str, case_name: str, run: int,
            names: list[str]) -> dict[str, Any]:
    """Run `run` of a case under `variant` in a fresh process and run directory, for `names` only;
    its records."""
    case = CASES[case_name]
    cache = work / "cache"
    cold = run == 0
    if cold:  # an empty build cache; later runs find what this one built
        shutil.rmtree(cache, ignore_errors=True)
    run_dir = work / case_name / variant / f"run-{run}"
    shutil.rmtree(run_dir, ignore_errors=True)  # fresh, whatever an earlier attempt left
    cands = run_dir / "candidates"
    cands.mkdir(parents=True)
    for name in names:
        shutil.copy(work / case_name / "candidates" / f"{name}.py", cands / f"{name}.py")
    spec = {"case": case_name, "run": run, "candidates": str(cands), "problems": case.problems,
            "protocol": args.protocol, "device": args.device, "run_dir": str(run_dir / "run"),
            "cache_dir": str(cache), "timer_budget": args.timer_budget, "trials": args.trials,
            "timeout": args.timeout, "standard_timing": args.standard_timing, "variant": variant,
            "results": str(run_dir / "results.json")}
    print(f"=== {case_name} {variant} run {run} ({'cold' if cold else 'warm'} cache): {len(names)} candidates",
          flush=True)
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env)
    wall = round(time.monotonic() - t0, 1)
    results = json.loads(Path(spec["results"]).read_text()) if Path(spec["results"]).exists() else []
    return {"run": {"case": case_name, "variant": variant, "run": run, "cache": "cold" if cold else "warm", "wall_s": wall,
                    "candidates": names, "exit": done.returncode}, "results": results}


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, case, pair, protocol): every run's speedup, max/min, which runs' intervals cover
    every other run's speedup, and the runs marked unstable."""
    groups: dict[tuple[str, str, str, str, str], dict[int, dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_key(r)[:5], {})[int(r["run"])] = r
    rows = []
    for (variant, case, problem, candidate, protocol), by_run in sorted(groups.items()):
        runs = sorted(by_run)
        speeds = {i: by_run[i]["speedup"] for i in runs}
        known = [s for s in speeds.values() if s is not None and s > 0]
        covers = {}
        for i in runs:
            iv, others = by_run[i]["interval"], [speeds[j] for j in runs if j != i and speeds[j] is not None]
            covers[i] = None if not iv or not others else all(iv[0] <= s <= iv[1] for s in others)
        timed = [by_run[i]["candidate_ms"] for i in runs if by_run[i].get("candidate_ms")]
        unmarked = [s for i, s in speeds.items() if s and "unstable_timing" not in by_run[i]["categories"]]
        identity = candidate.endswith("__identity")
        rows.append({"variant": variant, "case": case, "problem": problem, "candidate": candidate, "protocol": protocol,
                     "runs": runs, "speedups": [speeds[i] for i in runs],
                     "statuses": sorted({by_run[i]["status"] for i in runs}),
                     "max_over_min": max(known) / min(known) if len(known) > 1 else None,
                     "covers": [covers[i] for i in runs],
                     "unstable": sum("unstable_timing" in by_run[i]["categories"] for i in runs),
                     # the runs not marked unstable_timing: what a reader who drops the marked ones is left with
                     "unmarked_max_over_min": max(unmarked) / min(unmarked) if len(unmarked) > 1 else None,
                     # an identity's true speedup is 1: whether each run's interval holds it (None: no interval)
                     "holds_one": [_holds(by_run[i]["interval"], 1.0) for i in runs] if identity else None,
                     "candidate_ms": min(timed) if timed else None})
    return rows


def _holds(interval: Any, value: float) -> bool | None:
    return None if not interval else interval[0] <= value <= interval[1]


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 37's targets per (variant, case), over the pairs with two runs or more: the verified
    pairs' worst max/min (target HOLDS); the verified identities within 1.00 +- IDENTITY_WITHIN in every
    run, and their runs whose interval holds 1.00; the standard pairs that move more than MOVES, and how
    many of them have their unmarked runs within MOVES of each other (a moving pair is marked where it
    moved: the runs a reader keeps agree)."""
    out = []
    for variant, case in sorted({(r["variant"], r["case"]) for r in rows}):
        mine = [r for r in rows if r["variant"] == variant and r["case"] == case and len(r["runs"]) > 1]
        verified = [r for r in mine if r["protocol"] == "verified"]
        ratios = [r["max_over_min"] for r in verified if r["max_over_min"]]
        identities = [r for r in verified if r["holds_one"] is not None]
        speeds = [s for r in identities for s in r["speedups"] if s]
        held = [h for r in identities for h in r["holds_one"] if h is not None]
        moving = [r for r in mine if r["protocol"] == "standard" and (r["max_over_min"] or 1.0) > MOVES]
        out.append({"variant": variant, "case": case, "verified_pairs": len(ratios),
                    "verified_worst_max_over_min": max(ratios) if ratios else None,
                    "verified_within": sum(x <= HOLDS for x in ratios),
                    "identity_runs": len(speeds),
                    "identity_within": sum(abs(s - 1.0) <= IDENTITY_WITHIN for s in speeds),
                    "identity_intervals": len(held), "identity_holds_one": sum(held),
                    "standard_moving": len(moving),
                    "standard_moving_marked": sum((r["unmarked_max_over_min"] or 1.0) <= MOVES for r in moving)})
    return out


def by_cause(rows: list[dict[str, Any]], min_ms: float = 0.02) -> list[dict[str, Any]]:
    """Per (variant, protocol), over its pairs of `min_ms` or more with two runs or more: the median
    max/min across runs, and how many pairs stay within HOLDS."""
    out = []
    for variant, protocol in sorted({(r["variant"], r["protocol"]) for r in rows}):
        ratios = sorted(r["max_over_min"] for r in rows if r["variant"] == variant and r["protocol"] == protocol
                        and r["max_over_min"] and (r["candidate_ms"] or 0) >= min_ms)
        mid = ratios[len(ratios) // 2] if ratios else None
        out.append({"variant": variant, "protocol": protocol, "pairs": len(ratios), "median_max_over_min": mid,
                    "within": sum(x <= HOLDS for x in ratios)})
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'variant':15s} {'case':7s} {'problem':14s} {'candidate':24s} {'protocol':9s} {'status':17s} "
          f"{'speedups (run 0, 1, ...)':34s} {'max/min':>7s} {'covers':>7s} {'unstable':>8s}")
    for r in rows:
        speeds = " ".join(_fmt(s) for s in r["speedups"])
        judged = [c for c in r["covers"] if c is not None]
        covers = f"{sum(judged)}/{len(judged)}" if judged else "-"
        ratio = f"{r['max_over_min']:.2f}" if r["max_over_min"] else "-"
        unstable = f"{r['unstable']}/{len(r['runs'])}" if r["protocol"] == "standard" else "-"
        print(f"{r['variant']:15s} {r['case']:7s} {r['problem']:14s} {r['candidate']:24s} {r['protocol']:9s} "
              f"{','.join(r['statuses']):17s} {speeds:34s} {ratio:>7s} {covers:>7s} {unstable:>8s}")
    print("covers: runs whose 95% interval holds every other run's speedup; unstable: standard verdicts "
          "marked unstable_timing")
    print(f"\nper cause (pairs of 20 us or more): {'variant':15s} {'protocol':9s} {'pairs':>5s} "
          f"{'median max/min':>14s} {'within ' + str(HOLDS):>12s}")
    for c in by_cause(rows):
        mid = f"{c['median_max_over_min']:.3f}" if c["median_max_over_min"] else "-"
        print(f"{'':35s} {c['variant']:15s} {c['protocol']:9s} {c['pairs']:>5d} {mid:>14s} "
              f"{str(c['within']) + '/' + str(c['pairs']):>12s}")


def print_targets(rows: list[dict[str, Any]]) -> None:
    print(f"\ntargets: {'variant':15s} {'case':7s} {'verified max/min (worst)':>25s} "
          f"{'identity 1+-' + str(IDENTITY_WITHIN):>15s} {'interval holds 1':>16s} {'standard moving > ' + str(MOVES):>22s}")
    for t in targets(rows):
        worst = f"{t['verified_worst_max_over_min']:.2f}" if t["verified_worst_max_over_min"] else "-"
        print(f"{'':8s} {t['variant']:15s} {t['case']:7s} "
              f"{worst + ' (' + str(t['verified_within']) + '/' + str(t['verified_pairs']) + ' <= ' + str(HOLDS) + ')':>25s} "
              f"{str(t['identity_within']) + '/' + str(t['identity_runs']) + ' runs':>15s} "
              f"{str(t['identity_holds_one']) + '/' + str(t['identity_intervals']) + ' runs':>16s} "
              f"{str(t['standard_moving_marked']) + '/' + str(t['standard_moving']) + ' marked':>22s}")
    print("standard moving: pairs whose runs move more than " + str(MOVES) + "; marked: those whose runs left "
          "unmarked by unstable_timing agree within it")


def _fmt(s: float | None) -> str:
    return "-" if s is None else f"{s:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per pair (R)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cases", default=None, help="comma-separated: launch, large, tiny "
                        "(default: launch,large on a GPU, tiny on a CPU)")
    parser.add_argument("--protocol", default="both")
    parser.add_argument("--variants", default="default", help="comma-separated: " + ", ".join(VARIANTS)
                        + " (each run of each, interleaved)")
    parser.add_argument("--standard-timing", default="cuda_event", help="cuda_event, do_bench or host_time")
    parser.add_argument("--timer-budget", type=float, default=4.0)
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--work", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--out", default=None, help="results JSON (default WORK/repeat.json); a rerun resumes it")
    parser.add_argument("--salvage", action="store_true", help="only gather the pairs of runs cut short (WORK's "
                        "run directories) into --out, and stop: a step's time limit kills the bench, not this")
    parser.add_argument("--report", action="store_true", help="only print the tables of --out's runs, and stop")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(json.loads(args.child))
    if args.report:
        if not args.out or not Path(args.out).is_file():
            parser.error("--report needs --out, an earlier run's JSON")
        data = load(Path(args.out))
        print_table(summarise(data["results"]))
        print_targets(summarise(data["results"]))
        return 0
    if args.salvage:
        if not args.work or not args.out:
            parser.error("--salvage needs --work and --out")
        data = load(Path(args.out))
        before = len(data["results"])
        salvage(Path(args.work), data)
        save(Path(args.out), data)
        print(f"salvaged {len(data['results']) - before} pairs of runs cut short into {args.out}")
        return 0

    from kbv.settings import resolve_device

    args.device = resolve_device(args.device)
    cases = (args.cases or ("launch,large" if args.device.startswith("cuda") else "tiny")).split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; expected {sorted(CASES)}")
    protocols = ("standard", "verified") if args.protocol == "both" else (args.protocol,)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"unknown variant(s) {unknown}; expected some of {sorted(VARIANTS)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="kbv-repeat-"))
    out = Path(args.out) if args.out else work / "repeat.json"
    data = load(out)
    measured = {"device": args.device, "standard_timing": args.standard_timing}
    if data.setdefault("settings", measured) != measured:
        parser.error(f"{out} holds runs with {data['settings']}, not {measured}: give another --out and --work")
    salvage(work, data)
    names = {c: write_candidates(CASES[c], work / c / "candidates") for c in cases}
    for run in range(args.runs):
        for variant in variants:
            for case in cases:
                left = missing(data, variant, case, names[case], protocols, run)
                if not left:
                    print(f"=== {case} {variant} run {run}: every pair already measured, skipped")
                    continue
                got = one_run(args, work, variant, case, run, left)
                merge(data, got["results"])
                data["runs"].append(got["run"])
                save(out, data)
                if got["run"]["exit"] != 0:
                    print(f"{case} {variant} run {run} failed (exit {got['run']['exit']}); what it finished is kept",
                          file=sys.stderr)
                    return 1
    save(out, data)
    print_table(data["summary"])
    print_targets(data["summary"])
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
