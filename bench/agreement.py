"""kbv's standard protocol against KernelBench's own evaluator, on the same candidates and GPU, one after
the other (never both at once). Prints a table: per pair both statuses and both speedups; then the
status agreement, and the median and 90th percentile of |log(speedup ratio)| over pairs both call
correct (all of them, and the launch-bound ones: a reference under 100 us).

    PYTHONPATH=src python3 bench/agreement.py CANDIDATES --problems PROBLEMS --kernelbench KB/src \
        [--only L2/,L3/] [--limit N] [--jobs 12] [--tolerance 1e-4] [--out agreement.json]

Order: both sides' builds first, in parallel on the CPU (kbv's build cache; KernelBench's own
pre-compile, one process a candidate), so that nothing compiles while anything is timed; then `kbv eval
--protocol standard` over every pair; then KernelBench's `eval_kernel_against_ref`, one spawned process a
pair, as its batch scripts run it (`bench/kernelbench_oracle.py`). `--tolerance` is the standard
protocol's atol = rtol: KernelBench at HEAD uses 1e-4 for float32 (v0 and v0.1 used 1e-2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ORACLE = Path(__file__).with_name("kernelbench_oracle.py")
LAUNCH_BOUND_MS = 0.1
# kbv's standard statuses in KernelBench's vocabulary (compiled, correct, or why not)
COMMON = {"correct": "correct", "incorrect": "incorrect", "compile_error": "compile_error",
          "runtime_error": "runtime_error", "cuda_error": "runtime_error", "crashed": "runtime_error",
          "timeout": "runtime_error"}


@dataclass
class Row:
    problem: str
    candidate: str
    kbv_status: str = "-"
    kbv_speedup: float | None = None
    kbv_baseline_ms: float | None = None
    kb_status: str = "-"
    kb_speedup: float | None = None
    kb_ref_ms: float | None = None
    note: str = ""

    @property
    def agree(self) -> bool:
        return COMMON.get(self.kbv_status, self.kbv_status) == self.kb_status

    @property
    def log_ratio(self) -> float | None:
        if self.kbv_speedup and self.kb_speedup and self.kbv_speedup > 0 and self.kb_speedup > 0:
            return abs(math.log(self.kbv_speedup / self.kb_speedup))
        return None


def kb_status(reply: dict) -> str:
    if "oracle_error" in reply or reply.get("status") == "retry":
        return "oracle_error"
    if not reply.get("compiled"):
        return "compile_error"
    if reply.get("correctness"):
        return "correct"
    return "runtime_error" if any("runtime_error" in k for k in reply.get("errors", {})) else "incorrect"


def run_oracle(args: argparse.Namespace, problem: Path, candidate: Path, build_dir: Path, build_only: bool) -> dict:
    cmd = [sys.executable, str(ORACLE), "--kernelbench", args.kernelbench, "--problem", str(problem),
           "--candidate", str(candidate), "--build-dir", str(build_dir)] + (["--build-only"] if build_only else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"oracle_error": f"timed out after {args.timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"oracle_error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-300:]}"}
    return json.loads(lines[-1])


def select(args: argparse.Namespace):
    from kbv.candidates import load_candidates
    from kbv.problems import load_problems

    pairs = load_candidates(args.candidates, load_problems(args.problems)).pairs
    prefixes = [p for p in (args.only or "").split(",") if p]
    pairs = [p for p in pairs if not prefixes or any(p.problem.key.startswith(x) for x in prefixes)]
    return pairs[: args.limit] if args.limit else pairs


def build_kbv(args: argparse.Namespace, pairs, root: Path) -> None:
    """kbv's builds of `pairs` into its cache (the run then finds them built)."""
    from kbv.api import EvalConfig, warm_builds

    warm_builds(EvalConfig(candidates=args.candidates, problems=args.problems, device=args.device, jobs=args.jobs,
                           cache_dir=args.cache_dir, run_dir=str(root / "kbv-run")), [p.candidate for p in pairs])


def kbv_standard(args: argparse.Namespace, pairs, root: Path) -> dict[tuple[str, str], dict]:
    """kbv's standard verdicts of `pairs`, builds first: {(problem key, candidate name): verdict dict}."""
    from kbv.api import EvalConfig, evaluate

    cands = root / "candidates"
    for p in pairs:  # the same names, so the verdicts pair back by (problem, candidate)
        dst = cands / Path(p.candidate.origin).relative_to(args.candidates)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(p.candidate.code, encoding="utf-8")
    config = EvalConfig(candidates=str(cands), problems=args.problems, protocol="standard", device=args.device,
                        run_dir=str(root / "kbv-run"), tolerance=args.tolerance, jobs=args.jobs,
                        timeout_s=args.timeout, cache_dir=args.cache_dir)
    result = evaluate(config)
    return {(v.problem, v.candidate): v.to_dict() for v in result.verdicts}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("candidates")
    ap.add_argument("--problems", required=True)
    ap.add_argument("--kernelbench", required=True, help="the directory holding KernelBench's `kernelbench` package")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="", help="comma-separated problem-key prefixes, e.g. L2/,L3/")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.candidates = str(Path(args.candidates).resolve())
    from kbv.builds import needs_build

    pairs = select(args)
    root = Path(tempfile.mkdtemp(prefix="kbv-agreement-"))
    t0 = time.monotonic()
    builds = {i: root / "kb-builds" / str(i) for i in range(len(pairs))}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # both sides' builds, CPU only, before any timing
        kbv_built = pool.submit(build_kbv, args, pairs, root)
        compiled = [i for i, p in enumerate(pairs) if needs_build(p.candidate)]
        list(pool.map(lambda i: run_oracle(args, Path(pairs[i].problem.origin), Path(pairs[i].candidate.origin),
                                           builds[i], True), compiled))
        kbv_built.result()
    print(f"builds, both sides: {len(pairs)} candidates in {time.monotonic() - t0:.0f} s", flush=True)
    t1 = time.monotonic()
    ours = kbv_standard(args, pairs, root)
    print(f"kbv standard: {len(ours)} verdicts in {time.monotonic() - t1:.0f} s", flush=True)
    rows = []
    t2 = time.monotonic()
    for i, p in enumerate(pairs):
        row = Row(p.problem.key, p.candidate.name)
        v = ours.get((p.problem.key, p.candidate.name))
        if v is not None:
            row.kbv_status, row.kbv_speedup = v["status"], v.get("speedup")
            base = ((v.get("timing") or {}).get("baselines") or {})
            row.kbv_baseline_ms = next((b.get("mean_ms") for b in base.values()), None)
        reply = run_oracle(args, Path(p.problem.origin), Path(p.candidate.origin), builds[i], False)
        row.kb_status = kb_status(reply)
        row.note = reply.get("oracle_error", "")[:120]
        if row.kb_status == "correct" and reply.get("runtime_ms", -1) > 0:
            row.kb_speedup = reply["ref_runtime_ms"] / reply["runtime_ms"]
            row.kb_ref_ms = reply["ref_runtime_ms"]
        rows.append(row)
        print(f"  [{i + 1}/{len(pairs)}] {row.problem}: kbv {row.kbv_status} {row.kbv_speedup}, "
              f"KernelBench {row.kb_status} {row.kb_speedup}", flush=True)
    print(f"KernelBench: {len(rows)} pairs in {time.monotonic() - t2:.0f} s")
    report(rows)
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


def _fmt(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def report(rows: list[Row]) -> None:
    print(f"\n{'problem':52} {'kbv':>14} {'KernelBench':>14} {'kbv x':>8} {'KB x':>8} {'ratio':>7}  base ms")
    for r in rows:
        ratio = r.kbv_speedup / r.kb_speedup if r.kbv_speedup and r.kb_speedup else None
        base = r.kb_ref_ms if r.kb_ref_ms is not None else r.kbv_baseline_ms
        print(f"{r.problem[:52]:52} {r.kbv_status:>14} {r.kb_status:>14} {_fmt(r.kbv_speedup):>8} "
              f"{_fmt(r.kb_speedup):>8} {_fmt(ratio):>7}  {_fmt(base)} {'' if r.agree else '<- differs'} {r.note}")
    judged = [r for r in rows if r.kb_status != "oracle_error" and r.kbv_status in COMMON]
    agree = sum(r.agree for r in judged)
    print(f"\nstatus agreement: {agree}/{len(judged)} ({100 * agree / max(len(judged), 1):.1f} %; goal >= 95 %)"
          + (f"; {len(rows) - len(judged)} pairs without both verdicts" if len(judged) < len(rows) else ""))
    for label, subset in (("all", judged), (f"launch-bound (reference < {LAUNCH_BOUND_MS * 1e3:.0f} us)",
                                            [r for r in judged if (r.kb_ref_ms or 1.0) < LAUNCH_BOUND_MS])):
        logs = sorted(x for x in (r.log_ratio for r in subset) if x is not None)
        if logs:
            p90 = logs[min(len(logs) - 1, int(0.9 * len(logs)))]
            print(f"|log speedup ratio|, {label}: median {statistics.median(logs) * 100:.1f} %, "
                  f"p90 {p90 * 100:.1f} % over {len(logs)} pairs (goal: median <= 5 %)")


if __name__ == "__main__":
    sys.exit(main())
