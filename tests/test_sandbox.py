"""The trust boundary, driven directly: Sandbox (one child), ChildSpec, SharedArena and the wire.

Each test here starts real child processes (~2.5 s each on a small CPU box: the child imports torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kbv.errors import SandboxError
from kbv.sandbox import ChildFailure, ChildSpec, Sandbox, SharedArena
from kbv.sandbox.isolation import SandboxMode, resolve
from kbv.sandbox.wire import WireClosed, WireTimeout, map_tensor, read_frame, write_frame
from kbv.verdict import Status
from sources import EXITS_0, HANGS, HONEST_RELU, JUNK_STDOUT, SEGFAULT

CALL_TIMEOUT_S = 60.0
SECRET = "kbv-test-secret-7f3a9c"


@pytest.fixture
def spec(tmp_path: Path) -> ChildSpec:
    return ChildSpec(work_dir=tmp_path / "work", build_dir=tmp_path / "build", device="cpu")


@pytest.fixture
def arena() -> Iterator[SharedArena]:
    with SharedArena() as a:
        yield a


def _candidate(tmp_path: Path, code: str) -> Path:
    """The candidate file where kbv puts it: in the build directory, which a sandboxed child sees."""
    path = tmp_path / "build" / "candidate.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    return path


def _load(sb: Sandbox, path: Path) -> dict[str, Any]:
    return sb.call({"op": "load", "source": "candidate", "path": str(path), "init_args": [], "seed": 0},
                   CALL_TIMEOUT_S)


def _forward(sb: Sandbox, x: torch.Tensor,
             timeout_s: float = CALL_TIMEOUT_S) -> tuple[dict[str, Any], torch.Tensor]:
    """One forward on x through the child's own arena; the reply and the output buffer (poisoned
    with NaN beforehand)."""
    assert sb.arena is not None
    _, x_handle = sb.arena.share(x)
    out, out_handle = sb.arena.empty(x.shape, x.dtype)
    out.fill_(float("nan"))
    reply = sb.call({"op": "forward", "inputs": [x_handle], "outputs": [out_handle]}, timeout_s)
    return reply, out


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever inherited it, counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pid_namespace(sb: Sandbox) -> str | None:
    """The pid namespace the child runs in (bwrap's), None when it shares this one."""
    assert sb.proc is not None
    if not sb.isolation.full:
        return None
    init = Path(f"/proc/{sb.proc.pid}/task/{sb.proc.pid}/children").read_text().split()[0]
    return os.readlink(f"/proc/{init}/ns/pid")


def _in_namespace(ns: str) -> list[int]:
    """Live processes of pid namespace `ns`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == ns and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait_empty(ns: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _in_namespace(ns):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_dead(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


# -- the round trip ------------------------------------------------------------------------------

def test_hello_load_forward_round_trip(tmp_path: Path, spec: ChildSpec) -> None:
    path = _candidate(tmp_path, HONEST_RELU)
    with Sandbox(spec) as sb:
        hello = sb.call({"op": "hello"}, CALL_TIMEOUT_S)
        assert sb.proc is not None
        child = sb.proc.pid  # the child's own pid may be that of a pid namespace (bwrap)
        assert child != os.getpid() and hello["device"] == "cpu"
        assert os.getpgid(child) == child != os.getpgid(0)  # its own process group
        assert _load(sb, path)["loaded"] is True
        for seed in (1, 2):  # the same child serves new inputs, call after call
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(seed))
            reply, out = _forward(sb, x)
            assert reply["count"] == 1 and reply["copied"] is True
            assert reply["outputs"][0]["shape"] == [8, 32] and reply["outputs"][0]["dtype"] == "float32"
            torch.testing.assert_close(out, torch.relu(x), rtol=0, atol=0)
    assert not _alive(child)  # close() ends the child


def test_a_virtual_environment_reached_through_a_link_starts_children(tmp_path: Path, spec: ChildSpec,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`.venv -> /elsewhere/venv`: bubblewrap shows the environment under its real path only, and a child
    started by the link's path died at start-up, every pair of the run a failure."""
    python = Path(sys.executable)
    link = tmp_path / "venv-link"
    link.symlink_to(python.parent.parent)  # the environment's root, bin/ inside it
    monkeypatch.setattr(sys, "executable", str(link / python.parent.name / python.name))
    with Sandbox(spec) as sb:
        assert sb.call({"op": "hello"}, CALL_TIMEOUT_S)["device"] == "cpu"


def test_a_child_that_cannot_start_says_why(spec: ChildSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kbv.sandbox.parent.interpreter", lambda: "/nonexistent/kbv-test/python")
    with pytest.raises((ChildFailure, SandboxError)) as info:
        with Sandbox(spec) as sb:
            sb.call({"op": "hello"}, CALL_TIMEOUT_S)
    assert "No such file or directory" in str(info.value) and "/nonexistent/kbv-test/python" in str(info.value)


def test_shared_arena_shares_copies_by_file(arena: SharedArena) -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    shared, handle = arena.share(x)
    x.zero_()  # the arena holds a copy, not the caller's tensor
    mapped = map_tensor(handle)  # what a child sees
    assert torch.equal(mapped, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    mapped[0, 0] = 42.0  # an input is the child's copy-on-write: its writes never reach the parent's file
    assert shared[0, 0].item() == 0.0
    out, out_handle = arena.empty((3, 4), torch.float32)
    map_tensor(out_handle)[1, 1] = 7.0  # an output buffer is one memory: the child's writes are seen
    assert out[1, 1].item() == 7.0
    empty, empty_handle = arena.empty((0, 5), torch.int64)
    assert map_tensor(empty_handle).shape == (0, 5)
    arena.close()
    assert not Path(handle.path).exists() and not arena.dir.exists()


def test_wire_frames_time_out_close_and_cap_their_size() -> None:
    r, w = os.pipe()
    try:
        write_frame(w, b"hello")
        assert read_frame(r, time.monotonic() + 1) == b"hello"
        with pytest.raises(WireTimeout):
            read_frame(r, time.monotonic() + 0.2)
        write_frame(w, b"x" * 100)
        with pytest.raises(WireClosed, match="exceeds the 10-byte limit"):
            read_frame(r, time.monotonic() + 1, limit=10)
    finally:
        os.close(w)
    with pytest.raises(WireClosed):
        read_frame(r, time.monotonic() + 1)
    os.close(r)


# -- misbehaving children ------------------------------------------------------------------------

HANG_WITH_GRANDCHILD = textwrap.dedent('''\
    import subprocess
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            sleeper = subprocess.Popen(["sleep", "600"])
            with open("grandchild.pid", "w") as f:
                f.write(str(sleeper.pid))
            while True:
                pass
''')


def test_timeout_kills_the_whole_process_group(tmp_path: Path, spec: ChildSpec) -> None:
    path = _candidate(tmp_path, HANG_WITH_GRANDCHILD)
    grandchild = None
    try:
        with Sandbox(spec) as sb:
            child = sb.call({"op": "hello"}, CALL_TIMEOUT_S)["pid"]
            namespace = _pid_namespace(sb)
            _load(sb, path)
            t0 = time.monotonic()
            with pytest.raises(ChildFailure) as info:
                _forward(sb, torch.randn(4, 4), timeout_s=3.0)
            assert time.monotonic() - t0 < 10
            grandchild = int((spec.work_dir / "grandchild.pid").read_text())
            assert info.value.status is Status.TIMEOUT
            assert info.value.message == "no answer within 3 s (forward)"
            if namespace is not None:  # pids the child saw are its namespace's: every process of it is gone
                grandchild = None
                assert _wait_empty(namespace, 5), "a process of the child's pid namespace outlived the timeout"
            else:
                assert _wait_dead(child, 5)
                assert _wait_dead(grandchild, 5), "the candidate's own subprocess outlived the timeout"
    finally:
        if grandchild is not None and _alive(grandchild):
            os.kill(grandchild, 9)


@pytest.mark.parametrize(("code", "message", "returncode"), [
    (SEGFAULT, "killed by SIGSEGV during forward", -11),
    (EXITS_0, "exited with code 0 during forward, before answering", 0),
], ids=["segfault", "os_exit_0"])
def test_a_dying_child_is_crashed_with_its_stderr(tmp_path: Path, spec: ChildSpec,
                                                  code: str, message: str, returncode: int) -> None:
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, code))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.randn(4, 4))
    assert info.value.status is Status.CRASHED
    assert info.value.message == message
    assert info.value.evidence["returncode"] == returncode
    if code is SEGFAULT:
        assert "kbv-test: about to segfault" in info.value.evidence["stderr_tail"]


def test_a_raising_candidate_gets_its_traceback_and_the_child_serves_on(tmp_path: Path, spec: ChildSpec) -> None:
    code = HONEST_RELU.replace("return torch.relu(x)",
                               "if x.sum() < 0:\n            raise ValueError('kbv-test: negative sum')\n"
                               "        return torch.relu(x)")
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, code))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, -torch.ones(4, 4))
        assert info.value.status is Status.RUNTIME_ERROR
        assert info.value.message == "ValueError: kbv-test: negative sum (during forward)"
        assert 'candidate.py", line' in info.value.evidence["traceback"]
        reply, out = _forward(sb, torch.ones(4, 4))  # a Python exception does not end the child
        assert reply["copied"] and torch.equal(out, torch.ones(4, 4))


def test_a_device_error_ends_the_child(tmp_path: Path, spec: ChildSpec) -> None:
    code = HONEST_RELU.replace("return torch.relu(x)",
                               "raise RuntimeError('CUDA error: an illegal memory access was encountered')")
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, code))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.ones(4, 4))
        assert info.value.status is Status.CUDA_ERROR
        assert sb.proc is not None and sb.proc.poll() is not None  # never reused after a device error


def test_junk_on_stdout_and_stderr_does_not_break_the_protocol(tmp_path: Path, spec: ChildSpec) -> None:
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, JUNK_STDOUT))
        x = torch.randn(4, 8)
        reply, out = _forward(sb, x)
        assert reply["copied"] and torch.equal(out, torch.relu(x))
        evidence = sb.evidence()
    assert evidence["stdout_bytes"] > 1 << 20  # all of it was drained ...
    assert len(evidence["stdout_tail"]) <= 2000 and "kbv-test junk" in evidence["stdout_tail"]  # ... a tail kept
    assert "kbv-test stderr junk" in evidence["stderr_tail"]


def test_garbage_on_the_result_channel_is_a_crash(tmp_path: Path, spec: ChildSpec) -> None:
    code = HONEST_RELU.replace("return torch.relu(x)",
                               "import os, sys\n        os.write(int(sys.argv[2]), b'\\x00' * 7 + b'\\x05junk!')\n"
                               "        return torch.relu(x)")
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, code))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.ones(4, 4))
    assert info.value.status is Status.CRASHED
    assert "broke the protocol during forward" in info.value.message


# -- the environment -----------------------------------------------------------------------------

DUMP_ENV = textwrap.dedent('''\
    import json
    import os
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            raise RuntimeError("ENV=" + json.dumps({k: v[:200] for k, v in os.environ.items()}))
''')


def _env_seen_by_candidate(failure: ChildFailure) -> dict[str, str]:
    line = next(s for s in failure.evidence["traceback"].splitlines() if "ENV={" in s)
    return json.loads(line.split("ENV=", 1)[1])


def test_the_child_environment_is_scrubbed(tmp_path: Path, spec: ChildSpec) -> None:
    os.environ["OPENAI_API_KEY"] = SECRET
    os.environ["KBV_TEST_SERVICE_TOKEN"] = SECRET
    with Sandbox(spec) as sb:
        _load(sb, _candidate(tmp_path, DUMP_ENV))
        with pytest.raises(ChildFailure) as info:
            _forward(sb, torch.ones(2))
    env = _env_seen_by_candidate(info.value)
    assert env["KBV_DEVICE"] == "cpu"  # the dump itself works ...
    assert SECRET not in json.dumps(env)  # ... and holds no secret of the parent
    assert SECRET not in json.dumps(info.value.evidence)
    assert "OPENAI_API_KEY" not in env and "KBV_TEST_SERVICE_TOKEN" not in env
    assert env["HOME"] == str(spec.work_dir) and env["TMPDIR"].startswith(str(spec.work_dir))
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU child sees no GPU


PARENT_ENV_PROBE = textwrap.dedent('''\
    import os
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                raise RuntimeError("PARENT_ENV=" + f.read().decode(errors="replace").replace("\\0", ";"))
''')

# A parent process as kbv runs it, the secret in its environment from the start (an exported key).
# It prints {"child": pid} once the candidate is loaded, then how the forward ended.
PARENT_SCRIPT = textwrap.dedent('''\
    import json, os, sys
    from pathlib import Path
    import torch
    from kbv.sandbox import ChildFailure, ChildSpec, Sandbox

    tmp = Path(sys.argv[1])
    spec = ChildSpec(work_dir=tmp / "work", build_dir=tmp / "build", device="cpu")
    with Sandbox(spec) as sb:
        sb.call({"op": "hello"}, 60)
        sb.call({"op": "load", "source": "candidate", "path": sys.argv[2], "init_args": [], "seed": 0}, 60)
        namespace = None  # the child's pid namespace, when bwrap gave it one
        if sb.isolation.full:
            init = open(f"/proc/{sb.proc.pid}/task/{sb.proc.pid}/children").read().split()[0]
            namespace = os.readlink(f"/proc/{init}/ns/pid")
        print(json.dumps({"child": sb.proc.pid, "namespace": namespace}), flush=True)
        _, x = sb.arena.share(torch.ones(2))
        _, out = sb.arena.empty((2,), torch.float32)
        try:
            sb.call({"op": "forward", "inputs": [x], "outputs": [out]}, 600)
            print(json.dumps({"status": "answered"}))
        except ChildFailure as failure:
            print(json.dumps({"status": failure.status.value, "evidence": failure.evidence}))
''')


def _start_parent(tmp_path: Path, candidate: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, str(tmp_path), str(candidate)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(os.geteuid() == 0 and not resolve(SandboxMode.AUTO).full,
                    reason="a child running as root without namespaces reads every process's /proc/<pid>/environ")
def test_the_parent_environment_is_not_readable_through_proc(tmp_path: Path) -> None:
    path = _candidate(tmp_path, PARENT_ENV_PROBE)
    parent = _start_parent(tmp_path, path, env={**os.environ, "KBV_TEST_SERVICE_TOKEN": SECRET})
    stdout, stderr = parent.communicate(timeout=120)
    assert parent.returncode == 0, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["status"] == "runtime_error"  # the read failed (PermissionError) or found nothing ...
    assert SECRET not in json.dumps(result)  # ... either way the secret did not reach the candidate


def test_a_hanging_child_does_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    parent = _start_parent(tmp_path, _candidate(tmp_path, HANGS))
    child = None
    try:
        assert parent.stdout is not None
        started = json.loads(parent.stdout.readline())
        child = started["child"]
        time.sleep(1.0)  # the child is now spinning in forward
        parent.kill()
        parent.wait(timeout=30)
        assert _wait_dead(child, 5), "the child is still running 5 s after its parent was killed"
        if started["namespace"] is not None:
            assert _wait_empty(started["namespace"], 5), "a process of the child's namespace outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        parent.communicate()
        if child is not None and _alive(child):
            os.kill(child, 9)


def test_children_of_one_label_get_working_directories_of_their_own(tmp_path: Path) -> None:
    """Two samples with the same code give their children the same label: closing one child's
    scratch must not take the other's working directory away."""
    from kbv.settings import Settings

    settings = Settings(device="cpu", run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    with settings.child_scratch("verified-abc") as first:
        with settings.child_scratch("verified-abc") as second:
            assert first.work_dir != second.work_dir
            (second.work_dir / "scratch.txt").write_text("x")
        assert not second.work_dir.exists()
        assert first.work_dir.is_dir()
    assert not first.work_dir.exists()


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (bwrap's processes, then the child)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                todo += kids
    return found


def _layout(pid: int) -> str:
    """Where the dynamic loader is mapped in process `pid` (randomised per process unless ASLR is off)."""
    return next(line.split("-", 1)[0] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                if "/ld-linux" in line or "/ld-musl" in line)


def _served_by(sb: Sandbox) -> int:
    """The pid of the process that answers for `sb` (python -m kbv.sandbox.child, not bwrap's)."""
    assert sb.proc is not None
    for pid in [sb.proc.pid, *_descendants(sb.proc.pid)]:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"kbv.sandbox.child"]:
                return pid
    raise AssertionError(f"no kbv.sandbox.child process under pid {sb.proc.pid}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the personality flag is Linux's")
def test_children_asked_to_run_without_aslr_share_one_layout_keep_their_dropped_uid_and_serve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/identity_eval.py's no-aslr variant: the children that answer are laid out alike (bwrap's
    exec as root clears an inherited flag, so each child starts itself again with it), still run as the
    uid they dropped to, and serve as any other; children left as they are are laid out apart."""
    import kbv.sandbox.parent as parent

    def spec(name: str) -> ChildSpec:
        return ChildSpec(work_dir=tmp_path / name / "work", build_dir=tmp_path / name / "build", device="cpu")

    def layouts(aslr: bool) -> list[str]:
        monkeypatch.setattr(parent, "CHILD_ASLR", aslr)
        with Sandbox(spec(f"{aslr}-a")) as a, Sandbox(spec(f"{aslr}-b")) as b:
            found = []
            for sb in (a, b):
                assert sb.call({"op": "hello"}, CALL_TIMEOUT_S)["device"] == "cpu"
                pid = _served_by(sb)
                drop = sb.isolation.child_drop()
                if drop is not None:
                    uids = Path(f"/proc/{pid}/status").read_text().split("\nUid:")[1].split()[:3]
                    assert uids == [str(drop[0])] * 3, uids
                found.append(_layout(pid))
            path = _candidate(tmp_path / f"{aslr}-a", HONEST_RELU)
            assert _load(a, path)["loaded"] is True
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(3))
            torch.testing.assert_close(_forward(a, x)[1], torch.relu(x), rtol=0, atol=0)
            return found

    off = layouts(False)
    assert off[0] == off[1], off
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0":  # where the machine randomises
        assert len(set(layouts(True) + off[:1])) == 3  # each child its own layout, neither the one above
