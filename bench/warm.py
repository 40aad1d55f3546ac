"""Build every compiled candidate of a set into kbv's build cache, evaluating nothing: a later `kbv eval`
with the same cache (`KBV_CACHE_DIR` or `--cache-dir`) finds them built. Prints how many built and how long.

    PYTHONPATH=src python3 bench/warm.py CANDIDATES --problems PROBLEMS [--device cuda] [--jobs 14]
"""

from __future__ import annotations

import argparse
import sys
import time

from kbv.api import EvalConfig, warm_builds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("candidates")
    ap.add_argument("--problems", default="smoke")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    t0 = time.monotonic()
    builds = warm_builds(EvalConfig(candidates=args.candidates, problems=args.problems, device=args.device,
                                    jobs=args.jobs, cache_dir=args.cache_dir, run_dir="/tmp/kbv-warm"))
    failed = [b for b in builds if b.status is not None]
    print(f"{len(builds)} builds ({sum(b.cached for b in builds)} cached, {len(failed)} failed) in "
          f"{time.monotonic() - t0:.0f} s; build wall s: {sum(b.wall_s for b in builds):.0f}")
    for b in failed:
        print(f"  failed: {b.candidate_path.parent.name}: {b.message[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
