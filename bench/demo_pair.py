"""The demo, twice at once: two fresh checkouts of this tree, each with a cache of its own, run
`kbv eval examples/ --problems smoke --protocol both` side by side on one device (issue 37, step 6).

What a user sharing a GPU box with a colleague relies on, checked on both runs:
- every honest example is `verified` under the verified protocol, and every hack (`__hack_*`) is not;
- each run's builds are its own: its cache holds a finished build of every compiled candidate, and no
  file of its run directory, nor its output, names the other run's cache (children find their build
  outputs through TORCH_EXTENSIONS_DIR and TRITON_CACHE_DIR under the run's own cache).

Prints a table, writes --out JSON, and exits 1 when a check fails (2 on bad usage).

    PYTHONPATH=src python3 bench/demo_pair.py --device cuda --work /tmp/kbv-demo-pair --out demo_pair.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("a", "b")
COPIED = ("src", "examples", "pyproject.toml")  # what a checkout needs to run the demo from its source


def checkout(dest: Path) -> Path:
    """A fresh copy of this tree's source and examples at `dest` (no caches, no bytecode)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def start(name: str, work: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], dict[str, Path]]:
    """Run `name`'s demo in the background; its paths."""
    base = work / name
    paths = {"checkout": checkout(base / "checkout"), "cache": base / "cache", "run": base / "run",
             "log": base / "eval.log"}
    shutil.rmtree(paths["cache"], ignore_errors=True)
    shutil.rmtree(paths["run"], ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(paths["checkout"] / "src"), "KBV_CACHE_DIR": str(paths["cache"])}
    for var in ("TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR"):  # nothing shared through the caller's
        env.pop(var, None)
    command = [sys.executable, "-m", "kbv", "eval", "examples/", "--problems", "smoke", "--protocol", "both",
               "--device", args.device, "--timer-budget", str(args.timer_budget), "--run", str(paths["run"]),
               "--cache-dir", str(paths["cache"])]
    log = paths["log"].open("wb")
    proc = subprocess.Popen(command, cwd=paths["checkout"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its children (builds, sandboxes) go with it on a timeout
    log.close()
    return proc, paths


def judged(run_dir: Path) -> list[dict[str, Any]]:
    """Each verdict of a run: candidate, protocol, status."""
    from kbv.api import load_report

    return [{"problem": v.problem, "candidate": v.candidate, "protocol": v.protocol, "status": v.status.value}
            for v in load_report(run_dir).verdicts]


def is_hack(candidate: str) -> bool:
    return "__hack" in candidate


def foreign_mentions(paths: dict[str, Path], other_cache: Path) -> list[str]:
    """The files of a run (its directory and its output) that name the other run's cache."""
    needle = str(other_cache).encode()
    found = []
    for f in [paths["log"], *sorted(p for p in paths["run"].rglob("*") if p.is_file())]:
        try:
            if needle in f.read_bytes():
                found.append(str(f.relative_to(paths["log"].parent)))
        except OSError:
            continue
    return found


def builds(cache: Path) -> list[str]:
    """The build directories a cache holds (content-hash names)."""
    root = cache / "builds"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def check(name: str, verdicts: list[dict[str, Any]], paths: dict[str, Path], other: Path,
          exit_code: int | None, device: str) -> dict[str, Any]:
    """One run's figures and what failed. On a CPU the CUDA examples are `skipped` and left out; on a
    GPU a skipped honest example is a failure (a skipped hack counts as rejected: it did not pass)."""
    on_cpu = device == "cpu"
    skipped = [v for v in verdicts if v["status"] == "skipped"]
    verified = [v for v in verdicts if v["protocol"] == "verified" and not (on_cpu and v["status"] == "skipped")]
    honest = [v for v in verified if not is_hack(v["candidate"])]
    hacks = [v for v in verified if is_hack(v["candidate"])]
    problems = []
    if exit_code != 0:
        problems.append(f"kbv eval exited {exit_code}")
    problems += [f"honest {v['candidate']} is {v['status']}" for v in honest if v["status"] != "verified"]
    problems += [f"hack {v['candidate']} passed verified" for v in hacks if v["status"] == "verified"]
    if not honest or not hacks:
        problems.append(f"{len(honest)} honest and {len(hacks)} hack verdicts under verified: expected both")
    foreign = foreign_mentions(paths, other)
    problems += [f"{f} names the other run's cache" for f in foreign]
    own = builds(paths["cache"])
    if not own:
        problems.append("its cache holds no build")
    return {"run": name, "exit": exit_code, "verdicts": len(verdicts),
            "honest_verified": sum(v["status"] == "verified" for v in honest), "honest": len(honest),
            "hacks_rejected": sum(v["status"] != "verified" for v in hacks), "hacks": len(hacks),
            "builds": len(own), "foreign": foreign, "problems": problems, "skipped": len(skipped),
            "statuses": {f"{v['candidate']} {v['protocol']}": v["status"] for v in verdicts}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default="kbv-runs/demo-pair", help="the two checkouts, caches and runs")
    ap.add_argument("--timer-budget", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds both runs may take")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    work = Path(args.work).resolve()
    t0 = time.monotonic()
    started = {name: start(name, work, args) for name in RUNS}
    codes: dict[str, int | None] = {}
    for name, (proc, _) in started.items():
        try:
            codes[name] = proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            codes[name] = None
    wall = round(time.monotonic() - t0, 1)
    rows = []
    for name, (_, paths) in started.items():
        other = started[RUNS[1 - RUNS.index(name)]][1]["cache"]
        try:
            verdicts = judged(paths["run"])
        except Exception as exc:  # no run stored: the run's own log says why
            verdicts = []
            print(f"run {name}: no verdicts ({type(exc).__name__}: {exc}); its output: {paths['log']}", file=sys.stderr)
        rows.append(check(name, verdicts, paths, other, codes[name], args.device))
    shared = sorted(set(builds(started["a"][1]["cache"])) & set(builds(started["b"][1]["cache"])))
    print(f"two demos side by side on {args.device}, {wall} s")
    print(f"{'run':4s} {'exit':>4s} {'verdicts':>8s} {'honest verified':>16s} {'hacks rejected':>15s} "
          f"{'builds':>6s} {'foreign':>7s}")
    for r in rows:
        print(f"{r['run']:4s} {str(r['exit']):>4s} {r['verdicts']:8d} {r['honest_verified']:>9d} of {r['honest']:<4d} "
              f"{r['hacks_rejected']:>8d} of {r['hacks']:<4d} {r['builds']:6d} {len(r['foreign']):7d}")
    print(f"the same build keys in both caches (each built its own copy): {len(shared)}")
    failed = [f"run {r['run']}: {p}" for r in rows for p in r["problems"]]
    for line in failed:
        print(f"FAIL {line}")
    if not failed:
        print("every honest example verified, every hack rejected, each run's builds its own")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "wall_s": wall, "runs": rows,
                                              "same_keys_in_both": len(shared), "failed": failed}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
