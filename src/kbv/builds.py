"""The build stage: import each compiled candidate once in a sandbox child on a CPU worker, so its
C++/CUDA extensions are built before evaluation, in parallel (`--jobs`).

Build directories are keyed by a hash of the candidate's source and the toolchain, and shared across
runs: an unchanged candidate is not rebuilt. A marker file records a finished build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbv.candidates import Backend, Candidate
from kbv.sandbox import ChildFailure, ChildSpec, Sandbox
from kbv.settings import Settings
from kbv.verdict import Status

_MARKER = "build.json"
# An import that failed for one of these reasons on a GPU-less worker is retried by the evaluator.
_FINAL_MARKERS = ("Error building extension", "SyntaxError", "IndentationError", "CalledProcessError",
                  "defines no ModelNew", "NameError", "ModuleNotFoundError")


@dataclass(frozen=True)
class Build:
    """Where a candidate lives and whether it built. `status` None means ready to evaluate."""

    candidate_path: Path
    build_dir: Path
    status: Status | None = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    cached: bool = False
    refused: tuple[str, ...] = ()  # what the build child was refused (its sandbox), as its output shows


def build_key(candidate: Candidate, settings: Settings) -> str:
    import torch

    text = "\n".join([candidate.hash, torch.__version__, str(torch.version.cuda),
                      settings.device_type, settings.cuda_arch_list or ""])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def prepare_candidate(candidate: Candidate, settings: Settings) -> Build:
    """The build directory with `candidate.py` written into it (no compilation)."""
    build_dir = settings.cache_dir / "builds" / build_key(candidate, settings)
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / "candidate.py"
    if not path.exists() or path.read_text(encoding="utf-8") != candidate.code:
        path.write_text(candidate.code, encoding="utf-8")
    return Build(candidate_path=path, build_dir=build_dir)


def needs_build(candidate: Candidate) -> bool:
    return candidate.backend in (Backend.CUDA, Backend.CPP)


def build_candidate(candidate: Candidate, settings: Settings, label: str) -> Build:
    """Build `candidate` (or find it built). Never raises for a bad candidate."""
    prepared = prepare_candidate(candidate, settings)
    if not needs_build(candidate):
        return prepared
    marker = prepared.build_dir / _MARKER
    with open(prepared.build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build of a key at a time, across runs too
        if marker.exists():
            return _from_marker(prepared, marker)
        result = _run_build(prepared, settings, label)
        if result.status in (None, Status.COMPILE_ERROR):
            marker.write_text(json.dumps({"status": result.status.value if result.status else None,
                                          "message": result.message, "evidence": result.evidence,
                                          "wall_s": result.wall_s, "refused": list(result.refused)}))
        return result


def _from_marker(prepared: Build, marker: Path) -> Build:
    data = json.loads(marker.read_text())
    status = Status(data["status"]) if data.get("status") else None
    return Build(prepared.candidate_path, prepared.build_dir, status, data.get("message", ""),
                 data.get("evidence", {}), data.get("wall_s", 0.0), cached=True,
                 refused=tuple(data.get("refused", ())))


def _run_build(prepared: Build, settings: Settings, label: str) -> Build:
    spec = ChildSpec(work_dir=settings.work_dir(f"build-{label}"), build_dir=prepared.build_dir,
                     device="cpu", cuda_arch_list=settings.cuda_arch_list, isolation=settings.isolation,
                     hidden=settings.private_dirs)
    t0 = time.monotonic()
    sb = Sandbox(spec, label=label)
    try:
        with sb:
            sb.call({"op": "build", "path": str(prepared.candidate_path)}, settings.build_timeout_s)
    except ChildFailure as failure:
        wall = time.monotonic() - t0
        status = failure.status
        if status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CUDA_ERROR):
            trace = failure.evidence.get("traceback", "") + failure.message
            if not any(m in trace for m in _FINAL_MARKERS):  # retry on the device
                return Build(prepared.candidate_path, prepared.build_dir, wall_s=wall, refused=tuple(sb.refused()))
            status = Status.COMPILE_ERROR
        return Build(prepared.candidate_path, prepared.build_dir, status,
                     f"build: {failure.message}", failure.evidence, wall, refused=tuple(sb.refused()))
    return Build(prepared.candidate_path, prepared.build_dir, wall_s=time.monotonic() - t0,
                 refused=tuple(sb.refused()))
