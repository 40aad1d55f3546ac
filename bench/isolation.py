"""Do builds move a timing? A launch-bound honest kernel timed alone and while builds run, under each
build isolation (`kbv.placement`), side by side in one run. Prints a table; writes JSON.

The pair: `bench/problems/relu_launch_bound.py` (ReLU over 4096 floats: on a GPU, mostly the host's
launch path) with the honest CUDA ReLU of `examples/` (the C++ one on `--device cpu`). For each mode
(`none`: builds as any process, what issue 18 measured; `pin`; `hold`): one lane and one build pool
as `kbv eval` makes them; the pair once to warm (its build, the problem prepared); `--reps` pairs of
each protocol with no build running; then `--builds` builds kept in flight (fresh, unique
candidates of bench/templates.py: CUDA on a GPU, C++ on a CPU) and `--reps` pairs more. The table
gives, per mode and protocol, the median candidate and baseline times and speedup alone and under
load, the loaded/alone ratio of the speedup, and whether it stays within 2% or within the verified
interval (issue 18's target). "builds" is the fewest builds that were running as a loaded pair
started.

    PYTHONPATH=src python3 bench/isolation.py --device cuda --builds 14 --out isolation.json
    PYTHONPATH=src python3 bench/isolation.py --device cpu --builds 1 --reps 3
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from templates import VARIANTS  # noqa: E402


def load_lane(mode: str, args: argparse.Namespace, work: Path) -> tuple[Any, Any, Any]:
    """(lane, pool, plan) for `mode`, as `kbv.api` makes them for one device."""
    from kbv.api import EvalConfig, _lane_settings, _runners, _settings
    from kbv.builds import BuildPool
    from kbv.executors.local import LocalExecutor
    from kbv.placement import current_plan

    config = EvalConfig(candidates=str(work), problems=str(ROOT / "bench" / "problems"), protocol="both",
                        device=args.device, run_dir=str(work / f"run-{mode}"), cache_dir=str(work / "cache"),
                        jobs=args.builds, build_isolation=mode, timer_budget_s=args.timer_budget, trials=1,
                        seed=args.seed)
    settings = _settings(config, args.device)
    plan = current_plan(mode, 1, settings.device_type)
    settings.provenance["build_isolation"] = plan.describe()
    pool = BuildPool(settings, plan)
    lane_settings = _lane_settings(settings, plan, 0)
    secret = args.seed.to_bytes(16, "big", signed=True)
    return LocalExecutor(lane_settings, _runners(config, lane_settings, None, secret), pool), pool, plan


def background(pool: Any, count: int, device_type: str, salt: int) -> None:
    """Queue `count` fresh builds on `pool` (they run `pool`'s workers at a time)."""
    from kbv.candidates import Candidate, Pair
    from kbv.problems import Problem

    kind = "cuda_elementwise" if device_type == "cuda" else "cpp"
    variant = next(v for v in VARIANTS if v.kind == kind)
    problem = Problem(name=variant.problem, level=1, problem_id=2, code="# p\n", origin="p.py")
    for i in range(count):
        code = variant.template.substitute(kind=kind, salt=salt + i, **variant.fields)
        pool.start(Pair(problem, Candidate(code=code, name=f"load_{i}", origin=f"load_{i}.py", problem_ref=problem.name)))


def time_pairs(lane: Any, pair: Any, reps: int, tag: str, pool: Any) -> list[dict[str, Any]]:
    from kbv.executors import Job

    rows = []
    for i in range(reps):
        for protocol in ("standard", "verified"):
            running = pool.state().running
            verdict = lane.submit(Job(pair, protocol, f"{tag}-{protocol}-{i}")).result()
            timing = verdict.timing
            base = next(iter(timing.baselines.values())) if timing and timing.baselines else None
            ci = next(iter(timing.speedup_ci.values()), None) if timing and timing.speedup_ci else None
            rows.append({"protocol": protocol, "status": verdict.status.value, "speedup": verdict.speedup,
                         "categories": [c.value for c in verdict.categories], "message": verdict.message[:300],
                         "candidate_ms": timing.candidate.median_ms if timing else None,
                         "baseline_ms": base.median_ms if base else None, "ci": list(ci) if ci else None,
                         "builds_running": min(running, pool.state().running)})
            if verdict.categories:
                print(f"  {tag:12s} {protocol:8s} {verdict.status.value}: {verdict.message[:300]}", flush=True)
            print(f"  {tag:12s} {protocol:8s} {verdict.status.value:14s} speedup {verdict.speedup or 0:7.3f} "
                  f"cand {rows[-1]['candidate_ms'] or 0:8.4f} ms base {rows[-1]['baseline_ms'] or 0:8.4f} ms "
                  f"builds {rows[-1]['builds_running']}", flush=True)
    return rows


def run_mode(mode: str, args: argparse.Namespace, work: Path, pair: Any) -> dict[str, Any]:
    from kbv.sandbox import kill_all_children

    lane, pool, plan = load_lane(mode, args, work)
    print(f"mode {mode}: {plan.describe()}", flush=True)
    out: dict[str, Any] = {"mode": mode, "plan": plan.describe()}
    try:
        time_pairs(lane, pair, 1, f"{mode}-warm", pool)
        out["alone"] = time_pairs(lane, pair, args.reps, f"{mode}-alone", pool)
        background(pool, args.builds * 4, lane.settings.device_type, int(time.time()) % 10**8)
        deadline = time.monotonic() + 600
        while pool.state().running < args.builds and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(args.settle)  # the builds past their own start, into the compilers
        out["loaded"] = time_pairs(lane, pair, args.reps, f"{mode}-loaded", pool)
    finally:
        lane.close()
        pool.shutdown(wait=False)
        kill_all_children()  # the builds still running
        time.sleep(2)
    return out


def summarise(results: list[dict[str, Any]]) -> None:
    print(f"\n{'mode':6s} {'protocol':9s} {'cand alone':>11s} {'cand load':>10s} {'base alone':>11s} {'base load':>10s} "
          f"{'x alone':>8s} {'x load':>8s} {'ratio':>6s} {'builds':>6s}  same?")
    for res in results:
        for protocol in ("standard", "verified"):
            alone = [r for r in res.get("alone", []) if r["protocol"] == protocol and r["speedup"]]
            load = [r for r in res.get("loaded", []) if r["protocol"] == protocol and r["speedup"]]
            if not alone or not load:
                print(f"{res['mode']:6s} {protocol:9s} (no speedups: {[r['status'] for r in res.get('loaded', [])]})")
                continue

            def med(rows: list[dict[str, Any]], key: str) -> float:
                return statistics.median(r[key] for r in rows if r[key] is not None)

            sa, sl = med(alone, "speedup"), med(load, "speedup")
            ratio = sl / sa
            cis = [r["ci"] for r in alone if r["ci"]]
            within_ci = bool(cis) and statistics.median(c[0] for c in cis) <= sl <= statistics.median(c[1] for c in cis)
            same = "yes" if abs(ratio - 1) <= 0.02 or within_ci else "NO"
            print(f"{res['mode']:6s} {protocol:9s} {med(alone, 'candidate_ms'):11.4f} {med(load, 'candidate_ms'):10.4f} "
                  f"{med(alone, 'baseline_ms'):11.4f} {med(load, 'baseline_ms'):10.4f} {sa:8.3f} {sl:8.3f} "
                  f"{ratio:6.3f} {min(r['builds_running'] for r in load):6d}  {same}")
    print("(times in ms, medians over the reps; ratio = loaded speedup / alone; same: within 2% or within the "
          "verified interval)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--modes", default="none,pin,hold")
    parser.add_argument("--builds", type=int, default=0, help="builds in flight (default: the CPUs less the lane's 2)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timer-budget", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the builds' start and the timing")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kbv.candidates import Candidate, Pair
    from kbv.problems import load_problem_file
    from kbv.settings import resolve_device

    args.device = resolve_device(args.device)
    cuda = args.device.startswith("cuda")
    args.builds = args.builds or max(1, len(os.sched_getaffinity(0)) - 2)
    work = Path(args.work or tempfile.mkdtemp(prefix="kbv-isolation-"))
    problem = load_problem_file(ROOT / "bench" / "problems" / "relu_launch_bound.py")
    example = ROOT / "examples" / ("2_ReLU__cuda.py" if cuda else "2_ReLU__cpp.py")
    pair = Pair(problem, Candidate(code=example.read_text(), name=f"relu_launch_bound__{example.stem.split('__')[1]}",
                                   origin=str(example), problem_ref=problem.name))
    results = [run_mode(mode.strip(), args, work, pair) for mode in args.modes.split(",") if mode.strip()]
    summarise(results)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "builds": args.builds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
