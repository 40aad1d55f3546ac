"""Two revisions of kbv side by side: the same `kbv eval` command timed in each, alternating.

Each revision is checked out in a worktree of its own and run from its source tree (`PYTHONPATH`,
this interpreter and its packages). A first, untimed run of each fills that revision's build cache,
so no timed run waits for a compile; then the timed runs alternate (A B A B ...), each into a fresh
run directory, so that a drift of the machine lands on both. Prints a table of the wall times and
the ratio of the means; every run's verdict counts are printed beside it, so that a faster revision
that evaluated less shows.

    python3 bench/revisions.py 51c786e HEAD --runs 2
    python3 bench/revisions.py v1 v2 -- examples/ --problems smoke --protocol verified --device cpu

The command after `--` is what follows `kbv eval` (default: `make demo`'s evaluation on the CPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = [str(ROOT / "examples"), "--problems", "smoke", "--protocol", "both", "--device", "cpu", "--timer-budget", "2"]


def checkout(rev: str, where: Path) -> Path:
    """A detached worktree of `rev` at `where`."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(where), rev],
                   check=True, capture_output=True, text=True)
    return where


def run_once(tree: Path, args: list[str], run_dir: Path, cache_dir: Path) -> tuple[float, str]:
    """Seconds of one `kbv eval` in `tree`, and the last line it printed (its run summary)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "KBV_CACHE_DIR": str(cache_dir)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kbv", "eval", *args, "--run", str(run_dir)], cwd=tree, env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if done.returncode not in (0, 1):  # 1: some problems failed, the run itself finished
        tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
        raise SystemExit(f"kbv eval failed in {tree} (exit {done.returncode}): {tail}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return seconds, (lines[-1].strip() if lines else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = DEMO
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--runs", type=int, default=2, help="timed runs of each revision")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs takes a whole number of at least 1")
    work = Path(tempfile.mkdtemp(prefix="kbv-revisions-"))
    trees: dict[str, Path] = {}
    try:
        for label in ("before", "after"):
            trees[label] = checkout(getattr(args, label), work / label)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for label, tree in trees.items():  # untimed: fills the revision's build cache
            run_once(tree, command, work / f"warm-{label}", work / f"cache-{label}")
        for k in range(args.runs):
            for label, tree in trees.items():
                seconds, summary = run_once(tree, command, work / f"run-{label}-{k}", work / f"cache-{label}")
                times[label].append(seconds)
                print(f"  {label:6s} ({getattr(args, label)}) run {k + 1}: {seconds:7.1f} s   {summary}", flush=True)
        print(f"\n{'revision':24s} {'runs':>4s} {'mean s':>8s} {'min s':>8s} {'max s':>8s}")
        for label in trees:
            t = times[label]
            print(f"{label + ' ' + getattr(args, label):24s} {len(t):4d} {statistics.fmean(t):8.1f} {min(t):8.1f} {max(t):8.1f}")
        ratio = statistics.fmean(times["after"]) / statistics.fmean(times["before"])
        print(f"\nafter / before, mean wall time: {ratio:.2f}x")
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
