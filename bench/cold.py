"""A cold run as a user's first run of fresh samples: N unique candidates (`bench/templates.py`: a
realistic mix of load_inline CUDA elementwise, reduction, softmax and matmul kernels, Triton and
PyTorch ones, and C++ on a CPU), an empty build cache, both protocols, through `kbv.api.evaluate`.
Prints a table; writes JSON.

Figures: wall time against the floor (the larger of the builds' CPU-seconds over the CPUs and the
pairs' seconds over the lanes: no schedule can beat it), the time to the first verdict against one
build plus one pair, pairs per minute, build CPU-seconds (all, and per candidate by kind), the lanes'
busy share (seconds in pairs over wall x lanes; `kbv.api.RunStats`), the longest stretch without a
verdict (the CLI prints a line for each 30 s of it), and the verdicts by kind. Every template is
honest: a verdict other than verified/correct (no_custom_kernel for PyTorch ones under verified;
skipped for CUDA on a CPU) is reported and makes the exit status 1.

The build cache starts empty, and so do the precompiled headers (`kbv.pch`), as on a new machine;
`--pch-dir DIR` keeps those across runs, as a machine's cache does after its first run.

On `--device cpu` the CUDA candidates are built where the toolchain allows it (a torch with CUDA, or
`--emulate-cuda`, see bench/builds.py), then skipped: fine for build figures; the verdicts come
from the C++, Triton and PyTorch ones.

    PYTHONPATH=src python3 bench/cold.py --device cuda --n 40 --out cold.json      # GPU (full suite)
    PYTHONPATH=src python3 bench/cold.py --device cpu --n 12                       # CPU (smoke suite)

Several pairs per device against one at a time, on the same candidates (the first run makes them):

    PYTHONPATH=src python3 bench/cold.py --device cuda --n 55 --pairs-per-device 2 --work /tmp/cold-2
    PYTHONPATH=src python3 bench/cold.py --device cuda --candidates-from /tmp/cold-2/candidates --work /tmp/cold-1

Before/after: `--candidates-from DIR/candidates` evaluates an earlier run's candidates (fresh salts
are not drawn again), and the bench runs on an earlier kbv too (`PYTHONPATH=OLD/src`; it asks such a
kbv nothing it lacks, and takes its figures from when the verdicts landed; build CPU-seconds are
measured by the new kbv only):

    PYTHONPATH=src python3 bench/cold.py --device cuda --work /tmp/cold-new
    PYTHONPATH=/tmp/kbv-old/src python3 bench/cold.py --device cuda --candidates-from /tmp/cold-new/candidates
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from templates import MIX_CPU, MIX_GPU, generate  # noqa: E402


def expected(kind: str, protocol: str, device_type: str) -> set[str]:
    """The statuses an honest template may get."""
    if kind.startswith("cuda") and device_type != "cuda" or kind == "cpp" and device_type == "cuda":
        return {"skipped"}
    if protocol == "standard":
        return {"correct"}
    return {"verified", "no_custom_kernel"} if kind == "torch" else {"verified"}


def build_records(cache: Path) -> list[dict[str, Any]]:
    """What each fresh build of the run cost, by the kind its candidate says it is."""
    out = []
    for marker in sorted((cache / "builds").glob("*/build.json")):
        head = (marker.parent / "candidate.py").read_text().splitlines()[0]
        kind = head.split("kind=")[1].split()[0] if "kind=" in head else "?"
        data = json.loads(marker.read_text())
        out.append({"kind": kind, "cpu_s": float(data.get("cpu_s", 0.0)), "wall_s": float(data.get("wall_s", 0.0)),
                    "status": data.get("status")})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None, help="candidates (default: 40 on a GPU, 12 on a CPU)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--problems", default=None, help="default: full on a GPU, smoke on a CPU")
    parser.add_argument("--protocol", default="both")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--build-isolation", default="auto")
    parser.add_argument("--no-pch", action="store_true")
    parser.add_argument("--timer-budget", type=float, default=4.0)
    parser.add_argument("--pairs-per-device", type=int, default=1, help="pairs each device evaluates at once")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the mix's seed (salts are fresh every run)")
    parser.add_argument("--emulate-cuda", action="store_true", help="build CUDA candidates with a torch without CUDA")
    parser.add_argument("--pch-dir", default=None, help="keep the precompiled headers here across runs (a "
                        "machine's toolchain is warm after its first run; default: made in the run, as on a new machine)")
    parser.add_argument("--candidates-from", default=None,
                        help="evaluate the candidates an earlier run of this bench wrote (its DIR/candidates)")
    parser.add_argument("--work", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from kbv.settings import resolve_device

    device = resolve_device(args.device)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if args.emulate_cuda and torch.version.cuda is None:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench" / "cudaemu"), os.environ.get("PYTHONPATH", "")])
    work = Path(args.work or tempfile.mkdtemp(prefix="kbv-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.pch_dir:  # an empty build cache, the toolchain's precompiled headers kept
        Path(args.pch_dir).mkdir(parents=True, exist_ok=True)
        (work / "cache").mkdir(exist_ok=True)
        if not (work / "cache" / "pch").exists():
            (work / "cache" / "pch").symlink_to(Path(args.pch_dir).resolve(), target_is_directory=True)
    cands, kind_of = _candidates(args, work, device_type)
    print(f"{len(kind_of)} fresh candidates in {cands}: "
          + ", ".join(f"{k} {c}" for k, c in sorted(Counter(kind_of.values()).items())))
    result, marks = _evaluate(args, cands, work, device)
    return report(result, kind_of, build_records(work / "cache"), marks, device_type, args.out)


def _candidates(args: argparse.Namespace, work: Path, device_type: str) -> tuple[Path, dict[str, str]]:
    """The candidates' directory and each one's kind: made now, or an earlier run's."""
    if args.candidates_from:
        cands = Path(args.candidates_from)
        kind_of = {}
        for f in sorted(cands.glob("*.py")):
            head = f.read_text().splitlines()[0]
            kind_of[f.stem] = head.split("kind=")[1].split()[0] if "kind=" in head else "?"
        return cands, kind_of
    cands = work / "candidates"
    cands.mkdir(parents=True, exist_ok=True)
    made = generate(args.n or (40 if device_type == "cuda" else 12),
                    MIX_GPU if device_type == "cuda" else MIX_CPU, seed=args.seed)
    for g in made:
        (cands / g.file_name).write_text(g.code)
    return cands, {g.file_name.removesuffix(".py"): g.variant.kind for g in made}


def _evaluate(args: argparse.Namespace, cands: Path, work: Path, device: str) -> tuple[Any, list[float]]:
    """`kbv.api.evaluate` on the candidates, the seconds at which each verdict landed. It runs on an
    earlier kbv too (PYTHONPATH=OLD/src: what it lacks, it is not asked for), for a before/after."""
    import dataclasses
    import inspect

    from kbv.api import EvalConfig, evaluate

    marks: list[float] = []
    t0 = time.monotonic()

    def progress(done: int, total: int, verdict: Any) -> None:
        if verdict is None:
            return
        marks.append(time.monotonic() - t0)
        print(f"  [{done}/{total}] {marks[-1]:7.1f} s {verdict.protocol:8s} {verdict.candidate:42s} "
              f"{verdict.status.value:18s} pair {verdict.evidence.get('pair_s', 0.0):5.1f} s", flush=True)

    last_line = [0.0]

    def watch(state: Any, since_s: float) -> None:  # as the CLI prints it off a terminal
        if since_s < last_line[0]:  # a verdict landed since the last line
            last_line[0] = 0.0
        if since_s >= 30 and since_s - last_line[0] >= 30:
            last_line[0] = since_s
            print(f"  [no verdict for {since_s:.0f} s] {state.describe()}", flush=True)

    fields = {f.name for f in dataclasses.fields(EvalConfig)}
    extra = {k: v for k, v in (("build_isolation", args.build_isolation), ("pch", not args.no_pch),
                               ("pairs_per_device", args.pairs_per_device)) if k in fields}
    config = EvalConfig(candidates=str(cands), problems=args.problems or ("full" if device.startswith("cuda") else "smoke"),
                        protocol=args.protocol, device=device, run_dir=str(work / "run"), cache_dir=str(work / "cache"),
                        jobs=args.jobs, timer_budget_s=args.timer_budget, trials=args.trials, **extra)
    kwargs = {"watch": watch} if "watch" in inspect.signature(evaluate).parameters else {}
    return evaluate(config, progress=progress, **kwargs), marks


def report(result: Any, kind_of: dict[str, str], builds: list[dict[str, Any]], marks: list[float],
           device_type: str, out: str | None) -> int:
    import kbv

    stats = getattr(result, "stats", None)  # an earlier kbv has none: the figures come from the marks
    pair_s = [float(v.evidence.get("pair_s", 0.0)) for v in result.verdicts if v.evidence.get("pair_s")]
    wall = marks[-1] if marks else 0.0
    cpus = len(os.sched_getaffinity(0))
    lanes = stats.lanes if stats else 1
    fresh = [b for b in builds if b["cpu_s"] > 0]
    build_cpu = stats.build_cpu_s if stats else (sum(b["cpu_s"] for b in fresh) or None)
    floor = max((build_cpu or 0.0) / cpus, sum(pair_s) / lanes)
    gaps = [b - a for a, b in zip([0.0] + marks, marks)]
    one_build_one_pair = min((b["wall_s"] for b in builds if b["wall_s"]), default=0.0) + min(pair_s, default=0.0)
    figures = {"kbv": getattr(kbv, "__version__", "?"), "source": str(Path(kbv.__file__).parent), "pairs": len(marks),
               "wall_s": round(wall, 1), "floor_s": round(floor, 1), "wall_over_floor": round(wall / floor, 2) if floor else None,
               "first_verdict_s": round(marks[0], 1) if marks else None,
               "one_build_one_pair_s": round(one_build_one_pair, 1),
               "pairs_per_min": round(60 * len(marks) / wall, 1) if wall else None,
               "build_cpu_s": round(build_cpu, 1) if build_cpu is not None else None,
               "builds": len(builds), "busy_share": round(sum(pair_s) / (wall * lanes), 2) if wall else None,
               "longest_without_verdict_s": round(max(gaps, default=0.0), 1)}
    per_kind: dict[str, list[float]] = defaultdict(list)
    for b in fresh:
        per_kind[b["kind"]].append(b["cpu_s"])
    figures["build_cpu_s_median_by_kind"] = {k: round(statistics.median(v), 1) for k, v in sorted(per_kind.items())}
    print(f"\ncold run (kbv {figures['kbv']} from {figures['source']})")
    for name, value in figures.items():
        if name not in ("kbv", "source"):
            print(f"  {name:28s} {value}")
    print(f"  (floor: the larger of build CPU-s / {cpus} CPUs and pair seconds / {lanes} lane(s); busy share: "
          "seconds in pairs over wall x lanes)")
    wrong = _verdicts_by_kind(result, kind_of, device_type)
    if out:
        Path(out).write_text(json.dumps({"figures": figures, "builds": builds, "unexpected": [v.candidate for v in wrong],
                                         "verdicts": [{"candidate": v.candidate, "kind": kind_of.get(v.candidate),
                                                       "protocol": v.protocol, "status": v.status.value,
                                                       "pair_s": v.evidence.get("pair_s")} for v in result.verdicts]},
                                        indent=1))
    return 1 if wrong or result.problem_failures else 0


def _verdicts_by_kind(result: Any, kind_of: dict[str, str], device_type: str) -> list[Any]:
    """Print the statuses by kind; return the verdicts an honest template should not have got."""
    by_kind: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    wrong = []
    for v in result.verdicts:
        kind = kind_of.get(v.candidate, "?")
        by_kind[(kind, v.protocol)][v.status.value] += 1
        if v.status.value not in expected(kind, v.protocol, device_type):
            wrong.append(v)
    print("\nverdicts by kind")
    for (kind, protocol), counts in sorted(by_kind.items()):
        print(f"  {kind:18s} {protocol:9s} " + ", ".join(f"{s} {c}" for s, c in sorted(counts.items())))
    for v in wrong:
        print(f"  UNEXPECTED {v.protocol} {v.candidate}: {v.status.value}: {v.message[:200]}")
    for f in result.problem_failures:
        print(f"  problem failed: {f.message[:200]}")
    return wrong


if __name__ == "__main__":
    sys.exit(main())
