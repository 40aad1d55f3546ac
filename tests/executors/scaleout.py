"""Helpers of the executor tests: the smoke pairs they share, what verdicts must agree on, how a kbv
child and a Ray head are started (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
# a hack caught by a probe, an integrity violation, an honest Triton kernel, a wrong constant
EXAMPLES = ("1_Matmul__hack_pointer_cache.py", "2_ReLU__hack_identity.py", "2_ReLU__triton.py",
            "11_MSELoss__hack_constant.py")
RUN_OPTIONS = ("--problems", "smoke", "--protocol", "both", "--device", "cpu", "--seed", "7",
               "--timer-budget", "1", "--jobs", "1")


def outcome(verdicts: Any) -> dict[tuple[str, str, str], tuple[str, tuple[str, ...]]]:
    """(problem, candidate, protocol) -> (status, categories): what N lanes, a cluster and one lane
    must agree on (speedups differ run to run, and so do the notes on them: `Kind.TIMING`)."""
    from kbv.verdict import KIND, Kind

    return {(v.problem, v.candidate, v.protocol):
            (v.status.value, tuple(sorted(c.value for c in v.categories if KIND[c] is not Kind.TIMING)))
            for v in verdicts}


def kbv_env(**extra: str) -> dict[str, str]:
    """The environment of a `python -m kbv` child (and of a Ray cluster's workers): kbv from src/."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    # RAY_AUTH_MODE: Ray >= 2.5x turns token authentication on once ~/.ray/auth_token exists (a Ray
    # that ray.init started writes one); the test clusters and their drivers run without, alike
    return {**os.environ, "PYTHONPATH": path, "OMP_WAIT_POLICY": "PASSIVE", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled", **extra}


def kbv_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kbv", *args]


def require_ray() -> None:
    """Skip without the ray extra, except under CI (KBV_REQUIRE_RAY=1), where it must be there."""
    if os.environ.get("KBV_REQUIRE_RAY"):
        import ray  # noqa: F401
    else:
        pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'kernelbench-verified[ray]'")


@dataclass(frozen=True)
class RayHead:
    address: str  # HOST:PORT of its GCS
    temp_dir: Path  # its sessions: logs, sockets, spilled objects


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for_head(head: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited: {log.read_text()[-2000:]}")
        if "Ray runtime started" in log.read_text():
            return
        time.sleep(0.5)
    raise RuntimeError(f"no Ray head within {timeout_s:.0f} s: {log.read_text()[-2000:]}")
