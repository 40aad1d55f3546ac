"""Host memory: a candidate that eats the machine's memory is what the kernel's out-of-memory killer
takes, never kbv, and its verdict says so. The kill is real: the child is put in a memory cgroup of
its own, with a limit it outgrows (where this machine lets a test make one: root, cgroup v1 or v2)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kbv.sandbox import ChildFailure, ChildSpec, Sandbox
from kbv.sandbox.oom import FIRST_CHOICE, can_set_floor, kill_count
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


LOWERS_ITS_SCORE = """
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
except OSError:
    pass
""" + HONEST_RELU


def test_where_kbv_may_set_the_floor_a_candidate_cannot_lower_its_score_again(tmp_path: Path, spec: ChildSpec) -> None:
    if not can_set_floor():
        pytest.skip("the floor is set only with CAP_SYS_RESOURCE, which this process lacks")
    with Sandbox(spec) as sb:
        sb.started(CALL_TIMEOUT_S)
        _load(sb, tmp_path, LOWERS_ITS_SCORE)
        for pid in _child_pids(spec):
            assert int(Path(f"/proc/{pid}/oom_score_adj").read_text()) == FIRST_CHOICE


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of `limit` bytes, its `cgroup.procs` to write pids into; skips where none can be
    made, or where the host could swap instead of killing (swap it cannot limit)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    name = f"kbv-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if (v1 / "memory.limit_in_bytes").exists():
        group, limits = v1 / name, {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)}
    elif v2.exists() and "memory" in v2.read_text().split():
        group, limits = Path("/sys/fs/cgroup") / name, {"memory.max": str(limit), "memory.swap.max": "0"}
    else:
        pytest.skip("no memory cgroup controller this test may use")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        written = set()
        for f, value in limits.items():
            with contextlib.suppress(OSError):  # no swap accounting: the memory limit alone
                (group / f).write_text(value)
                written.add(f)
        if not written:
            pytest.skip("the memory cgroup takes no limit")
        swap = len(Path("/proc/swaps").read_text().splitlines()) > 1
        if swap and not written & {"memory.memsw.limit_in_bytes", "memory.swap.max"}:
            pytest.skip("this host swaps, and the cgroup cannot limit its swap: it would swap, not kill")
        yield group / "cgroup.procs"
    finally:
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:  # its processes are still exiting
                time.sleep(0.1)
        else:
            warnings.warn(f"the test's memory cgroup {group} could not be removed", stacklevel=1)


def _contain(procs: Path, pids: list[int]) -> None:
    """Move `pids` into the cgroup; skip unless the child's process is in it (else it would eat the host)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            procs.write_text(str(pid))
    inside = {int(p) for p in procs.read_text().split()}
    if not pids or not set(pids) <= inside:
        pytest.skip("the child could not be put in the test's memory cgroup")


@pytest.mark.slow
def test_a_candidate_that_eats_host_memory_is_killed_for_it_and_named(tmp_path: Path, spec: ChildSpec) -> None:
    if kill_count() is None:
        pytest.skip("this kernel does not count its out-of-memory kills")
    with _memory_cgroup(768 << 20) as procs, Sandbox(spec) as sb:
        sb.started(CALL_TIMEOUT_S)
        _load(sb, tmp_path, EATS_HOST_MEMORY)
        _contain(procs, children_under(spec.work_dir))  # bubblewrap's too: what the child starts goes in with it
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.randn(4, 4))
    assert info.value.status is Status.CRASHED
    assert info.value.message.startswith("killed by the kernel's out-of-memory killer during forward")
    assert info.value.evidence["host_oom_kills"] >= 1


def test_a_child_kbv_killed_itself_is_never_blamed_on_host_memory(tmp_path: Path, spec: ChildSpec,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted run kills its children; an out-of-memory kill elsewhere on the host meanwhile
    does not make theirs one."""
    import kbv.sandbox.parent as parent

    counts = iter(range(100, 10_000))
    monkeypatch.setattr(parent, "kill_count", lambda: next(counts))  # the host's count rises at every read
    with Sandbox(spec) as sb:
        sb.started(CALL_TIMEOUT_S)
        _load(sb, tmp_path, HONEST_RELU.replace("return torch.relu(x)", "import time\n        time.sleep(30)"))
        import threading

        threading.Timer(2.0, parent.kill_all_children).start()
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.randn(4, 4))
    assert "out-of-memory" not in info.value.message and "SIGKILL" in info.value.message


class _KilledForOthersRunner:
    """A protocol whose candidate's child the out-of-memory killer ends `kills` times, while the child
    held `peak` bytes: the kernel's account of a bystander killed for memory others took."""

    name = "standard"

    def __init__(self, kills: int, peak: int) -> None:
        self.kills = kills
        self.peak = peak
        self.evaluations = 0

    def prepare(self, pair):
        return object()

    def release(self, context: object) -> None:
        pass

    def blank(self, pair):
        from kbv.protocols import blank_verdict
        from kbv.protocols.standard import StandardProtocol

        return blank_verdict(pair, StandardProtocol(), {})

    def evaluate(self, pair, prepared, build, sb):
        from dataclasses import replace

        self.evaluations += 1
        if self.evaluations <= self.kills:
            return replace(self.blank(pair), status=Status.CRASHED,
                           message="killed by the kernel's out-of-memory killer during forward",
                           evidence={"host_oom_kills": 1, "child_peak_rss_bytes": self.peak})
        return replace(self.blank(pair), status=Status.CORRECT, message="5/5 trials passed")


def _evaluate_once(tmp_path: Path, runner: _KilledForOthersRunner):
    from kbv.candidates import Candidate, Pair
    from kbv.executors import Job
    from kbv.executors.local import LocalExecutor
    from kbv.problems import Problem
    from kbv.settings import Settings

    problem = Problem(name="19_ReLU", level=1, problem_id=19, code="# problem\n", origin="level1/19_ReLU.py")
    cand = Candidate(code=HONEST_RELU, name="19_ReLU__honest", origin="c.py", problem_ref="19_ReLU")
    executor = LocalExecutor(Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache"),
                             {"standard": runner})
    try:
        fut = executor.submit(Job(Pair(problem, cand), "standard", "k0"))
        return fut.exception(timeout=300) or fut.result()
    finally:
        executor.close()


def test_a_small_child_killed_for_others_memory_is_judged_again_and_gets_its_own_verdict(tmp_path: Path) -> None:
    runner = _KilledForOthersRunner(kills=1, peak=200 << 20)  # 200 MiB: a bystander's honest child
    verdict = _evaluate_once(tmp_path, runner)
    assert verdict.status is Status.CORRECT and runner.evaluations >= 2


def test_a_child_killed_twice_for_others_memory_is_a_run_failure_not_a_verdict(tmp_path: Path) -> None:
    from kbv.errors import RunFailure

    runner = _KilledForOthersRunner(kills=2, peak=180 << 20)
    failure = _evaluate_once(tmp_path, runner)
    assert isinstance(failure, RunFailure) and runner.evaluations == 2
    message = str(failure)
    assert message.startswith("level1/19_ReLU.py: the host ran out of memory twice while 19_ReLU__honest ran")
    assert "not the candidate's doing" in message and "180 MiB" in message


def test_a_candidate_that_itself_took_the_hosts_memory_stays_crashed(tmp_path: Path) -> None:
    from kbv.memory_plan import host_total_bytes

    runner = _KilledForOthersRunner(kills=1, peak=int(0.9 * host_total_bytes()))
    failure = _evaluate_once(tmp_path, runner)
    assert failure.status is Status.CRASHED and runner.evaluations == 1
