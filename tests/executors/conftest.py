"""Fixtures for the executors: a few smoke-suite pairs from `examples/` (Triton and torch-level
candidates only: no C++ build), their verdicts from one local lane, a local Ray cluster, and a
two-node one (a head declaring a GPU, and a CPU-only node)."""

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


def _ray_start(args: list[str], log: Path, cache_dir: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address=127.0.0.1",
           "--disable-usage-stats", "--object-store-memory=100000000", *args]
    return subprocess.Popen(cmd, env=kbv_env(KBV_CACHE_DIR=str(cache_dir)), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def gpu_and_cpu_nodes(cache_dir: Path) -> Iterator[RayHead]:
    """A head that declares one GPU (and one CPU: nothing on this machine uses it as a GPU) and a
    node with 4 CPUs (declared) and no GPU, both on loopback, the second registered before it is
    yielded. A driver joins the head's node."""
    require_ray()
    temp = Path(tempfile.mkdtemp(prefix="kbvr-", dir="/tmp"))
    port, client, agent, dashboard, agent2, grpc2, metrics2 = free_ports(7)
    head = _ray_start(["--head", f"--port={port}", "--num-cpus=1", "--num-gpus=1", "--include-dashboard=false",
                       f"--temp-dir={temp}", f"--ray-client-server-port={client}",
                       f"--dashboard-agent-listen-port={agent}", f"--dashboard-port={dashboard}"],
                      temp / "ray-head.log", cache_dir)
    node = None
    try:
        wait_for_head(head, temp / "ray-head.log")
        node = _ray_start([f"--address=127.0.0.1:{port}", "--num-cpus=4", "--num-gpus=0",
                           f"--dashboard-agent-listen-port={agent2}", f"--dashboard-agent-grpc-port={grpc2}",
                           f"--metrics-export-port={metrics2}"], temp / "ray-node.log", cache_dir)
        wait_for_head(node, temp / "ray-node.log")
        _wait_for_nodes(f"127.0.0.1:{port}", 2)
        yield RayHead(f"127.0.0.1:{port}", temp)
    finally:
        if node is not None:
            _stop(node)
        _stop(head)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_nodes(address: str, count: int, timeout_s: float = 120.0) -> None:
    """Until the cluster at `address` has `count` live nodes (a node's log says it started before the
    cluster lists it)."""
    script = (f"import time, ray\nray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
              f"deadline = time.monotonic() + {timeout_s}\n"
              f"while sum(n['Alive'] for n in ray.nodes()) < {count} and time.monotonic() < deadline:\n"
              "    time.sleep(0.5)\n"
              f"raise SystemExit(0 if sum(n['Alive'] for n in ray.nodes()) >= {count} else 1)\n")
    done = subprocess.run([sys.executable, "-c", script], env=kbv_env(), capture_output=True, text=True,
                          timeout=timeout_s + 60)
    if done.returncode != 0:
        raise RuntimeError(f"the cluster at {address} has fewer than {count} nodes: {done.stderr[-2000:]}")
