"""What counting the candidate's own launches costs a call (kbv.sandbox.guards), side by side in one
process: an extension's function called bare, through the counting wrapper as kbv made it before
(a new wrapper on every access, then the count's clock and lock), through the kept wrapper with
counting on (outside timed loops), and inside a timed loop (uncounted); and Triton's launch wrapper
counting and timed. The function is a tiny torch op, so the figures are the wrappers' own host
microseconds, which a launch-bound kernel's timing would carry. Prints a table; `--out` writes JSON.

    PYTHONPATH=src python3 bench/guard_overhead.py --calls 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kbv.sandbox.guards import Guards, _CountingModule


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def ways(x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    module = types.ModuleType("relu_ext")
    module.forward = torch.relu  # type: ignore[attr-defined]
    counting, timed = Guards([]), Guards([])
    timed.timed = True
    ext, ext_timed = _CountingModule(module, counting), _CountingModule(module, timed)
    kernel = types.SimpleNamespace(fn=torch.relu)
    def launch(k: Any, *a: Any) -> Any:  # what JITFunction.run stands for here
        return k.fn(*a)

    run, run_timed = counting._counting_run(launch), timed._counting_run(launch)

    def rebuilt() -> Any:  # the wrapper made anew on each access, as before
        return _CountingModule.__getattr__(ext, "forward")(x)

    return {"bare": lambda: module.forward(x), "ext, new wrapper each call (before)": rebuilt,
            "ext, kept wrapper, counted": lambda: ext.forward(x), "ext, timed loop": lambda: ext_timed.forward(x),
            "triton run, bare": lambda: launch(kernel, x), "triton run, counted": lambda: run(kernel, x), "triton run, timed loop": lambda: run_timed(kernel, x)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5, help="every way once a round, in turn; the median")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    x = torch.randn(16)
    fns = ways(x)
    for fn in fns.values():
        per_call_us(fn, 1000)  # warm
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            samples[name].append(per_call_us(fn, args.calls))
    med = {name: statistics.median(s) for name, s in samples.items()}
    print(f"{'way':40s} {'us a call':>10s} {'over bare':>10s}")
    for name, us in med.items():
        bare = med["triton run, bare"] if name.startswith("triton") else med["bare"]
        print(f"{name:40s} {us:>10.2f} {us - bare:>+10.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "us": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
