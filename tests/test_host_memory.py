"""Host memory: a candidate that eats the machine's memory is what the kernel's out-of-memory killer
takes, never kbv, and its verdict says so. The kill is real: the child is put in a memory cgroup of
its own, with a limit it outgrows (where this machine lets a test make one: root, cgroup v1 or v2)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kbv.sandbox import ChildFailure, ChildSpec, Sandbox
from kbv.sandbox.oom import FIRST_CHOICE, kill_count
from kbv.verdict import Status
from sources import HONEST_RELU, children_under

CALL_TIMEOUT_S = 60.0

# allocates, and touches, 64 MiB at a time until the machine (or its cgroup) has no more to give
EATS_HOST_MEMORY = HONEST_RELU.replace(
    "return torch.relu(x)",
    "blocks = []\n        while True:\n            blocks.append(bytearray(64 << 20))\n        return torch.relu(x)")


def _child_pids(spec: ChildSpec) -> list[int]:
    """The kbv child's processes (not bubblewrap's own around it, whose command line holds the child's)."""
    found = []
    for pid in children_under(spec.work_dir):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"kbv.sandbox.child"]:
                found.append(pid)
    return found


def _load(sb: Sandbox, tmp_path: Path, code: str) -> None:
    path = tmp_path / "build" / "candidate.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    sb.call({"op": "load", "source": "candidate", "path": str(path), "init_args": [], "seed": 0}, CALL_TIMEOUT_S)


def _forward(sb: Sandbox, x: torch.Tensor) -> None:
    assert sb.arena is not None
    _, x_handle = sb.arena.share(x)
    _, out_handle = sb.arena.empty(x.shape, x.dtype)
    sb.call({"op": "forward", "inputs": [x_handle], "outputs": [out_handle]}, CALL_TIMEOUT_S)


@pytest.fixture
def spec(tmp_path: Path) -> ChildSpec:
    return ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu")


def test_every_child_is_the_out_of_memory_killers_first_choice_and_kbv_is_not(spec: ChildSpec) -> None:
    with Sandbox(spec) as sb:
        sb.started(CALL_TIMEOUT_S)
        pids = _child_pids(spec)
        assert pids, "the child's process was not found"
        for pid in pids:
            assert int(Path(f"/proc/{pid}/oom_score_adj").read_text()) == FIRST_CHOICE
    assert int(Path("/proc/self/oom_score_adj").read_text()) < FIRST_CHOICE  # kbv itself stays as it was


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of `limit` bytes, its `cgroup.procs` to write pids into; skips where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    name = f"kbv-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        group, limits = v1 / name, ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    elif "memory" in (Path("/sys/fs/cgroup/cgroup.subtree_control").read_text()
                      if Path("/sys/fs/cgroup/cgroup.subtree_control").exists() else ""):
        group, limits = Path("/sys/fs/cgroup") / name, ("memory.max", "memory.swap.max")
    else:
        pytest.skip("no memory cgroup controller this test may use")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        for f in limits:
            with contextlib.suppress(OSError):  # no swap accounting: the memory limit alone
                (group / f).write_text("0" if f == "memory.swap.max" else str(limit))
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # its processes are still exiting
                time.sleep(0.1)


@pytest.mark.slow
def test_a_candidate_that_eats_host_memory_is_killed_for_it_and_named(tmp_path: Path, spec: ChildSpec) -> None:
    if kill_count() is None:
        pytest.skip("this kernel does not count its out-of-memory kills")
    with _memory_cgroup(768 << 20) as procs, Sandbox(spec) as sb:
        sb.started(CALL_TIMEOUT_S)
        _load(sb, tmp_path, EATS_HOST_MEMORY)
        for pid in children_under(spec.work_dir):  # bubblewrap's too: what the child starts goes in with it
            with contextlib.suppress(OSError):
                procs.write_text(str(pid))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.randn(4, 4))
    assert info.value.status is Status.CRASHED
    assert info.value.message.startswith("killed by the kernel's out-of-memory killer during forward")
    assert info.value.evidence["host_oom_kills"] >= 1
