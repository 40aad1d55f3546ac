"""Fixtures for the executors: a few smoke-suite pairs from `examples/` (Triton and torch-level
candidates only: no C++ build), their verdicts from one local lane, and a local Ray cluster."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
    must agree on (speedups differ run to run)."""
    return {(v.problem, v.candidate, v.protocol): (v.status.value, tuple(sorted(c.value for c in v.categories)))
            for v in verdicts}


def kbv_env(**extra: str) -> dict[str, str]:
    """The environment of a `python -m kbv` child (and of a Ray cluster's workers): kbv from src/."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_WAIT_POLICY": "PASSIVE", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def kbv_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kbv", *args]


@pytest.fixture(scope="session")
def smoke_candidates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smoke-candidates")
    for name in EXAMPLES:
        shutil.copy(ROOT / "examples" / name, root / name)
    return root


@pytest.fixture(scope="session")
def one_lane(smoke_candidates: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The smoke pairs, both protocols, on one CPU lane: the verdicts others must equal."""
    from kbv.api import EvalConfig, evaluate

    run = tmp_path_factory.mktemp("one-lane") / "run"
    return evaluate(EvalConfig(candidates=str(smoke_candidates), problems="smoke", protocol="both", device="cpu",
                               seed=7, timer_budget_s=1.0, jobs=1, run_dir=str(run), cache_dir=str(cache_dir)))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


@pytest.fixture(scope="session")
def ray_cluster(cache_dir: Path) -> Iterator[RayHead]:
    """A one-node Ray cluster on loopback with 2 CPUs, its workers importing kbv from src/. Stopped by signalling the `ray start --block` we started (no `ray stop`:
    other Ray instances on the machine are not ours)."""
    require_ray()
    temp = Path(tempfile.mkdtemp(prefix="kbvr-", dir="/tmp"))  # short: Ray's socket paths are bounded
    port, client, agent, dashboard = _free_ports(4)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
           "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false",
           "--disable-usage-stats", "--object-store-memory=100000000", f"--temp-dir={temp}",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-port={dashboard}"]
    log = (temp / "ray-start.log").open("w")
    head = subprocess.Popen(cmd, env=kbv_env(KBV_CACHE_DIR=str(cache_dir)), stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        _wait_for_head(head, temp / "ray-start.log")
        yield RayHead(address, temp)
    finally:
        head.send_signal(signal.SIGTERM)  # drains, then stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_head(head: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited: {log.read_text()[-2000:]}")
        if "Ray runtime started" in log.read_text():
            return
        time.sleep(0.5)
    raise RuntimeError(f"no Ray head within {timeout_s:.0f} s: {log.read_text()[-2000:]}")
