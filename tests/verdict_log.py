"""A GPU session keeps every fixture's verdict: with KBV_CORPUS_LOG set, the corpus and timing tests
append one JSON line per verdict to that file (bench/gpu_session.sh collects it)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from kbv.verdict import Verdict


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
