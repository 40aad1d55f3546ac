"""Fixtures for the executors: a few smoke-suite pairs from `examples/` (Triton and torch-level
candidates only: no C++ build), their verdicts from one local lane, and a local Ray cluster."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scaleout import EXAMPLES, ROOT, RayHead, free_ports, kbv_env, require_ray, wait_for_head


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


@pytest.fixture(scope="session")
def ray_cluster(cache_dir: Path) -> Iterator[RayHead]:
    """A one-node Ray cluster on loopback with 2 CPUs, its workers importing kbv from src/. Stopped by
    signalling the `ray start --block` we started (no `ray stop`: other Ray instances on the machine
    are not ours)."""
    require_ray()
    temp = Path(tempfile.mkdtemp(prefix="kbvr-", dir="/tmp"))  # short: Ray's socket paths are bounded
    port, client, agent, dashboard = free_ports(4)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
           "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false",
           "--disable-usage-stats", "--object-store-memory=100000000", f"--temp-dir={temp}",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-port={dashboard}"]
    log = (temp / "ray-start.log").open("w")
    head = subprocess.Popen(cmd, env=kbv_env(KBV_CACHE_DIR=str(cache_dir)), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_head(head, temp / "ray-start.log")
        yield RayHead(f"127.0.0.1:{port}", temp)
    finally:
        head.send_signal(signal.SIGTERM)  # drains, then stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
