"""The Ray executor (`kbv.executors.ray`) on a real one-node cluster started by the tests (`ray`
marker): the smoke pairs get the verdicts of one local lane; a driver killed with SIGKILL resumes,
losing and duplicating nothing; a worker killed mid-pair is retried once, then the pair is `crashed`;
Ctrl-C cancels what is running; the secret is found in no log, environment or file; on a cluster with
a CPU-only node, that node takes the builds and the GPU node the pairs; a missing extra and an
unreachable address are one-line errors (exit 2)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from scaleout import RUN_OPTIONS, RayHead, kbv_command, kbv_env, outcome, require_ray
from typer.testing import CliRunner

from kbv.cli import app
from kbv.store import DB_NAME
from kbv.verdict import Verdict

RAY_OPTIONS = ("--executor", "ray", "--ray-address")


def _eval(head: RayHead, candidates: Path, run: Path, *extra: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kbv_command("eval", str(candidates), *RUN_OPTIONS, *RAY_OPTIONS, head.address,
                                      "--run", str(run), *extra),
                          env=kbv_env(), capture_output=True, text=True, timeout=timeout_s)


def _verdicts(stdout: str) -> list[Verdict]:
    return [Verdict.from_dict(v) for v in json.loads(stdout)["verdicts"]]


def _stored_keys(run: Path) -> list[str]:
    with sqlite3.connect(f"file:{run / DB_NAME}?mode=ro", uri=True, timeout=10) as db:
        try:
            return [k for (k,) in db.execute("SELECT key FROM verdicts")]
        except sqlite3.OperationalError:  # the driver has made the file, not yet its tables
            return []


def _write_candidate(root: Path, name: str, init_body: str) -> Path:
    """A 2_ReLU candidate whose constructor runs `init_body` (which may use os, signal, time, json)."""
    root.mkdir(parents=True, exist_ok=True)
    body = "\n".join("        " + line for line in init_body.strip().splitlines())
    (root / f"2_ReLU__{name}.py").write_text(
        "import json\nimport os\nimport signal\nimport time\n\nimport torch\nimport torch.nn as nn\n\n\n"
        "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        f"{body}\n\n    def forward(self, x):\n        return torch.relu(x)\n")
    return root


# -- without a cluster ----------------------------------------------------------------------------


def test_a_missing_ray_extra_is_a_one_line_error_naming_it(smoke_candidates: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where the extra is absent
    result = CliRunner().invoke(app, ["eval", str(smoke_candidates), "--executor", "ray", "--run", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kernelbench-verified[ray]'" in lines[0], result.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "no-port-here"])
def test_an_unreachable_ray_address_is_a_one_line_error(address: str, smoke_candidates: Path, tmp_path: Path) -> None:
    require_ray()
    address = address.format(port=_closed_port())
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["eval", str(smoke_candidates), "--executor", "ray", "--ray-address", address,
                                      "--run", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --ray-address {address}:"), result.stderr
    assert time.monotonic() - t0 < 30


# -- on the cluster -------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_the_smoke_pairs_under_ray_get_the_verdicts_of_one_local_lane(ray_cluster: RayHead, one_lane: Any,
                                                                     smoke_candidates: Path, tmp_path: Path) -> None:
    done = _eval(ray_cluster, smoke_candidates, tmp_path / "run", "--format", "json")
    assert done.returncode == 0, done.stderr
    verdicts = _verdicts(done.stdout)
    assert outcome(verdicts) == outcome(one_lane.verdicts)
    assert all(v.provenance.get("host") for v in verdicts)  # each says which node measured it


@pytest.mark.ray
@pytest.mark.slow
def test_a_driver_killed_with_sigkill_resumes_losing_and_duplicating_nothing(
        ray_cluster: RayHead, one_lane: Any, smoke_candidates: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = kbv_command("eval", str(smoke_candidates), *RUN_OPTIONS, *RAY_OPTIONS, ray_cluster.address, "--run", str(run))
    driver = subprocess.Popen(cmd, env=kbv_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        if (run / DB_NAME).exists() and len(_stored_keys(run)) >= 2:
            break
        time.sleep(0.2)
    assert driver.poll() is None, f"the driver finished before it could be killed: {driver.stderr.read()}"
    driver.kill()  # SIGKILL: no handler runs, Ray cancels what the dead driver owned
    driver.wait(timeout=30)
    before = _stored_keys(run)
    assert 2 <= len(before) < 8

    resumed = _eval(ray_cluster, smoke_candidates, run, "--format", "json")
    assert resumed.returncode == 0, resumed.stderr
    after = _stored_keys(run)
    assert len(after) == len(set(after)) == 8 and set(before) <= set(after)
    verdicts = _verdicts(resumed.stdout)
    assert len(verdicts) == 8 and outcome(verdicts) == outcome(one_lane.verdicts)
    table = _eval(ray_cluster, smoke_candidates, run)
    assert "(evaluated 0, resumed 8," in table.stdout, table.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_a_worker_killed_mid_pair_is_retried_once_then_the_pair_is_crashed(ray_cluster: RayHead, tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    cands = _write_candidate(tmp_path / "cands", "kills_its_worker", f"""
with open({str(attempts)!r}, "a") as f:
    f.write(str(os.getpid()) + "\\n")
os.kill(os.getppid(), signal.SIGKILL)  # the process that evaluates it: a Ray worker
""")
    # a sandboxed child can reach neither its worker nor this file: the worker's loss, which is what is
    # tested here, is staged by a child outside the sandbox
    done = subprocess.run(kbv_command("eval", str(cands), "--problems", "smoke", "--device", "cpu", *RAY_OPTIONS,
                                      ray_cluster.address, "--run", str(tmp_path / "run"), "--format", "json",
                                      "--sandbox", "off"),
                          env=kbv_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (verdict,) = _verdicts(done.stdout)  # Ray's own messages went to stderr: stdout is the JSON alone
    assert verdict.status.value == "crashed"
    assert "the Ray task failed 2 times" in verdict.message and "Error" in verdict.message, verdict.message
    assert len(attempts.read_text().splitlines()) == 2  # the first worker's loss was retried, once


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_cancels_the_running_tasks_and_their_children(ray_cluster: RayHead, tmp_path: Path) -> None:
    cands = _write_candidate(tmp_path / "cands", "sleeps", """
open("sleeping", "w").close()  # in its own working directory: the one place its sandbox lets it write
time.sleep(600)
""")
    cmd = kbv_command("eval", str(cands), "--problems", "smoke", "--device", "cpu", *RAY_OPTIONS,
                      ray_cluster.address, "--run", str(tmp_path / "run"))
    driver = subprocess.Popen(cmd, env=kbv_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not _sleeping() and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    children = _children_in_worker_dirs()  # the candidate's (bwrap's and its own), the baseline's
    assert children and _sleeping(), "the candidate never started sleeping"
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err
    assert "interrupted" in err
    deadline = time.monotonic() + 60
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(c) for c in children), "the candidate's child outlived its cancelled task"


def _worker_dirs() -> Path:
    return Path(tempfile.gettempdir()) / "kbv-ray"  # where a worker's run directories live


def _sleeping() -> bool:
    return any(_worker_dirs().glob("*/work/*/sleeping"))


def _children_in_worker_dirs() -> list[int]:
    """Processes whose working directory lies in a Ray worker's run directory: its children."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if "/kbv-ray/" in os.readlink(entry / "cwd") and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.ray
@pytest.mark.slow
def test_the_secret_travels_only_with_the_task(ray_cluster: RayHead, cache_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A known secret, made where the driver makes it: the verdict was made with it, and neither the
    candidate's environment, its parent's environment and command line, nor any file of the cluster's
    sessions (logs, sockets' neighbours, spilled objects) holds it."""
    import kbv.api
    from kbv.api import EvalConfig, evaluate

    secret = b"KBV-SECRET-MARKER-0123456789abcd"
    monkeypatch.setattr(kbv.api, "_secret", lambda config: secret)
    monkeypatch.setenv("RAY_AUTH_MODE", kbv_env()["RAY_AUTH_MODE"])  # as the cluster
    # what it saw comes back in its verdict (its sandbox lets it write nothing the test could read)
    cands = _write_candidate(tmp_path / "cands", "snoops", """
seen = {"env": dict(os.environ), "files": sorted(os.listdir("."))}
for name in ("environ", "cmdline"):
    try:
        with open(f"/proc/{os.getppid()}/{name}", "rb") as f:
            seen["parent_" + name] = f.read().decode("latin-1")
    except OSError as exc:
        seen["parent_" + name] = str(exc)
raise RuntimeError("SEEN=" + json.dumps(seen))
""")
    result = evaluate(EvalConfig(candidates=str(cands), problems="smoke", protocol="verified", executor="ray",
                                 ray_address=ray_cluster.address, timer_budget_s=1.0, run_dir=str(tmp_path / "run"),
                                 cache_dir=str(cache_dir)))
    (verdict,) = result.verdicts
    assert verdict.provenance["verified_secret_sha256"] == hashlib.sha256(secret).hexdigest()[:16]
    marks = (secret, secret.hex().encode(), secret.decode().encode("utf-16-le"))
    seen = json.dumps(verdict.to_dict())
    assert "parent_environ" in seen and not any(m.decode("latin-1") in seen for m in marks[:2])
    for path in ray_cluster.temp_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert not any(m in data for m in marks), f"the secret is in {path}"


@pytest.mark.ray
@pytest.mark.slow
def test_without_an_address_a_local_ray_is_started_for_the_run_and_stopped_after_it(tmp_path: Path) -> None:
    require_ray()
    temp = Path(tempfile.mkdtemp(prefix="kbvr-", dir="/tmp"))  # where that Ray keeps its sessions
    try:
        cands = _write_candidate(tmp_path / "cands", "plain", "pass")
        done = subprocess.run(kbv_command("eval", str(cands), "--problems", "smoke", "--device", "cpu", "--executor",
                                          "ray", "--run", str(tmp_path / "run"), "--format", "json"),
                              env=kbv_env(RAY_TMPDIR=str(temp)), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        (verdict,) = _verdicts(done.stdout)
        assert verdict.status.value == "correct", verdict.message
        assert any(temp.rglob("session_*")), "the run did not start a Ray of its own"
        deadline = time.monotonic() + 30
        while _processes_mentioning(str(temp)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_mentioning(str(temp)), "Ray processes outlived the run that started them"
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes() and _alive(int(proc.name)):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


# A "C++" candidate (the backend regex matches the comment) that compiles nothing: a build task that
# takes a second, and an honest ReLU.
NO_COMPILE_CPP = """\
# cpp_sources = (none: built by importing it, which compiles nothing)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + {salt}.0 * 0.0
"""


@pytest.mark.ray
@pytest.mark.slow
def test_cpu_only_nodes_take_the_builds_and_gpu_nodes_the_pairs(gpu_and_cpu_nodes: RayHead, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Pairs ask for a GPU as under `--device cuda` (the head's is declared, not real, so they
    evaluate on its CPU); builds ask for a CPU, as always. The driver joins the GPU node, where Ray
    alone put one build of three in trials (its preference for CPU-only nodes gives way once they are
    half busy): kbv sends every build to the CPU-only node, and every pair runs on the GPU node."""
    import ray

    import kbv.executors.ray as kray
    from kbv.api import EvalConfig, evaluate

    monkeypatch.setattr(kray, "_resources", lambda kind: {"num_gpus": 1})
    monkeypatch.setenv("RAY_AUTH_MODE", kbv_env()["RAY_AUTH_MODE"])
    executors: list[Any] = []
    init = kray.RayExecutor.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        executors.append(self)

    monkeypatch.setattr(kray.RayExecutor, "__init__", keep)
    cands = tmp_path / "cands"
    cands.mkdir()
    for salt in range(3):
        (cands / f"2_ReLU__nocompile{salt}.py").write_text(NO_COMPILE_CPP.format(salt=salt))
    result = evaluate(EvalConfig(candidates=str(cands), problems="smoke", protocol="standard", device="cpu",
                                 executor="ray", ray_address=gpu_and_cpu_nodes.address,
                                 run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache")))
    assert [v.status.value for v in result.verdicts] == ["correct"] * 3, [v.message for v in result.verdicts]
    ray.init(address=gpu_and_cpu_nodes.address, logging_level="ERROR", log_to_driver=False)
    try:
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()
    gpu_node = next(node for node, res in nodes.items() if res.get("GPU"))
    cpu_node = next(node for node, res in nodes.items() if not res.get("GPU"))
    (executor,) = executors
    assert set(executor.build_nodes().values()) == {cpu_node}  # all three builds
    assert len(executor.build_nodes()) == 3
    assert {v.provenance["ray_node"] for v in result.verdicts} == {gpu_node}
    assert result.stats is not None and result.stats.builds == 3
