"""A GPU session keeps every fixture's verdict: with KBV_CORPUS_LOG set, the corpus and timing tests
append one JSON line per verdict to that file. With KBV_RUN_LOG set, the runs of the GPU tests that
pass `run_log(name)` to `evaluate` append a line there per verdict and, every WAIT_S without one, what
the run is doing (bench/gpu_session.sh sets it under $OUT): a test that a step's limit or pytest's
timeout ends still says which pair it was on."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

from kbv.verdict import Verdict

WAIT_S = 30.0


def log_verdicts(verdicts: Iterable[Verdict]) -> None:
    path = os.environ.get("KBV_CORPUS_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        for v in verdicts:
            d = v.to_dict()
            f.write(json.dumps({"fixture": v.candidate, "protocol": v.protocol, "status": v.status.value,
                                "categories": d["categories"], "speedup": v.speedup, "memory": d["memory"],
                                "baseline_memory": d["baseline_memory"], "message": v.message[:300]}) + "\n")


def run_log(name: str) -> dict[str, Any]:
    """`evaluate`'s progress and watch callbacks that write to KBV_RUN_LOG (none where it is unset)."""
    path = os.environ.get("KBV_RUN_LOG")
    if not path:
        return {}
    started, said = time.monotonic(), [0.0]

    def line(text: str) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%H:%M:%S')} +{time.monotonic() - started:.0f}s {name}: {text}\n")

    def progress(done: int, total: int, what: Any) -> None:
        if what is not None:
            status = getattr(what, "status", None)
            line(f"[{done}/{total}] {getattr(what, 'problem', '')} {getattr(what, 'candidate', '')} "
                 f"{getattr(what, 'protocol', '')} {status.value if status is not None else 'problem failed'}")

    def watch(state: Any, since_s: float) -> None:
        if since_s >= WAIT_S and since_s - said[0] >= WAIT_S:
            said[0] = since_s
            line(f"no verdict for {since_s:.0f} s: {state.describe()}")
        elif since_s < said[0]:
            said[0] = 0.0

    line("started")
    return {"progress": progress, "watch": watch}


def log_figures(name: str, **figures: Any) -> None:
    """One line of a GPU test's figures in KBV_RUN_LOG (nothing where it is unset), written as the test
    goes: a test that a step's limit ends before pytest reports still leaves what it measured."""
    path = os.environ.get("KBV_RUN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {name}: {json.dumps(figures, default=str)}\n")
