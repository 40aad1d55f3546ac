"""Candidates that try to get out of their sandbox, through kbv's command line as a user runs it.

`tests/escape/` holds three correct ReLUs that, as they load, try what a hostile policy would: write
outside their directory (/tmp, /var/tmp), find the run's database (from every visible command line's
`--run DIR`, and from their own working directory) and append to it, read other processes'
environment (the parent holds a secret) and memory, write into kbv's code, the build cache and their
own source, and connect to ports this test listens on. One does it from C++ (a shared-library
constructor, in the build child and again in the evaluation child), one from Python beside a Triton
kernel, one through libc with ctypes. Every attempt must fail, the run must complete with every
verdict intact in a sound database, and the refusals must show in the verdicts' evidence.

The run is `kbv eval --sandbox strict` as root, and again as an ordinary user (uid 65534 under
`setpriv`, in a mount namespace where the interpreter, which lives under /root here, is reachable).
Full isolation is required: without bubblewrap and namespaces these tests skip, and under CI
(KBV_REQUIRE_SANDBOX=1, set by .ci/run) they fail instead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kbv
from kbv.sandbox.isolation import SandboxMode, code_paths, resolve
from kbv.store import open_store
from kbv.verdict import Status
from sources import RELU_PROBLEM, write_tree

FIXTURES = Path(__file__).parent / "escape"
KINDS = ("cpp", "triton", "ctypes")
PORTS = range(47310, 47320)  # the fixtures try each
NOBODY = 65534
SRC = Path(kbv.__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _require_full_isolation() -> None:
    iso = resolve(SandboxMode.AUTO)
    if not iso.full:
        if os.environ.get("KBV_REQUIRE_SANDBOX"):
            pytest.fail(f"KBV_REQUIRE_SANDBOX is set and the sandbox is not full: {iso.describe()}")
        pytest.skip(f"needs bubblewrap and namespaces: {iso.describe()}")


def _markers() -> list[Path]:
    return [Path(d) / f"kbv-escape-marker-{k}" for d in ("/tmp", "/var/tmp") for k in KINDS]


@dataclass(frozen=True)
class EscapeRun:
    run_dir: Path
    cache_dir: Path
    returncode: int
    stdout: str
    stderr: str
    secret: str
    connections: int  # accepted by the listeners while the run ran


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A directory every uid can pass (pytest's own are 0700, which uid 65534 could not reach), with
    the build cache both runs share: the C++ fixture is built once."""
    root = Path(tempfile.mkdtemp(prefix="kbv-escape-"))
    os.chmod(root, 0o755)
    (root / "cache").mkdir()
    write_tree(root / "problems", {"level1/19_ReLU.py": RELU_PROBLEM})
    shutil.copytree(FIXTURES, root / "candidates")
    for path in (root, *root.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for marker in _markers():
            marker.unlink(missing_ok=True)


def _listeners() -> list[socket.socket]:
    """A listening socket on every port of PORTS that is free."""
    found = []
    for port in PORTS:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen(16)
        s.setblocking(False)
        found.append(s)
    return found


def _accepted(listeners: list[socket.socket]) -> int:
    count = 0
    for s in listeners:
        while True:
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                break
            conn.close()
            count += 1
        s.close()
    return count


def _as_nobody(cmd: list[str]) -> list[str]:
    """`cmd` as uid 65534 with no groups, in a mount namespace whose /root holds only the interpreter's
    directories (root's home is 0700 here): an ordinary user's view, on the host's network and pids."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    under_root = [p for p in code_paths() if p.startswith("/root/")]
    dirs = sorted({str(d) for p in under_root for d in Path(p).parents if str(d).startswith("/root/")})
    binds = [a for d in dirs for a in ("--perms", "0755", "--dir", d)]  # bwrap would make them 0700
    binds += [a for p in under_root for a in ("--ro-bind", p, p)]
    return [bwrap, "--dev-bind", "/", "/", "--perms", "0755", "--tmpfs", "/root", *binds, "--",
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *cmd]


def run_escape(scratch: Path, name: str, as_user: bool) -> EscapeRun:
    run_dir = scratch / f"run-{name}"
    secret = secrets.token_hex(16)
    if as_user:
        run_dir.mkdir()
        for path in (run_dir, scratch / "cache", *(scratch / "cache").rglob("*")):
            os.lchown(path, NOBODY, NOBODY)
    cmd = [sys.executable, "-m", "kbv", "eval", str(scratch / "candidates"), "--problems", str(scratch / "problems"),
           "--protocol", "standard", "--device", "cpu", "--run", str(run_dir), "--cache-dir", str(scratch / "cache"),
           "--sandbox", "strict", "--format", "json", "--jobs", "1"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "KBV_TEST_SECRET": secret, "COLUMNS": "200"}
    listeners = _listeners()
    try:
        done = subprocess.run(_as_nobody(cmd) if as_user else cmd, env=env, capture_output=True, text=True,
                              timeout=900, cwd=scratch)
    finally:
        connections = _accepted(listeners)
    return EscapeRun(run_dir, scratch / "cache", done.returncode, done.stdout, done.stderr, secret, connections)


def check_nothing_escaped(run: EscapeRun) -> None:
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sandbox: bwrap (" in run.stderr  # the run said how its children were isolated
    assert run.connections == 0, "a child reached a port of this machine"
    for marker in _markers():
        assert not marker.exists(), f"a child wrote {marker}"
    escaped = [p for p in (SRC / "kbv").rglob("kbv-escape*")] + [p for p in run.cache_dir.rglob("kbv-escape*")]
    assert not escaped, f"a child wrote {escaped}"
    originals = {p.read_text() for p in FIXTURES.glob("*.py")}
    for source in run.cache_dir.glob("builds/*/candidate.py"):
        assert source.read_text() in originals, f"a child rewrote {source}"
    db = run.run_dir / "kbv.sqlite"
    with sqlite3.connect(db) as conn:
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert b"kbv-escape was here" not in b"".join(p.read_bytes() for p in run.run_dir.glob("kbv.sqlite*"))
    with open_store(run.run_dir, create=False) as store:
        verdicts = {v.candidate: v for v in store.verdicts()}
    assert sorted(verdicts) == sorted(f"19_ReLU__escape_{k}" for k in KINDS)
    everything = run.stdout + run.stderr + json.dumps([v.to_dict() for v in verdicts.values()])
    assert run.secret not in everything, "a child read the parent's environment"
    for name, v in verdicts.items():
        assert v.status is Status.CORRECT, (name, v.status, v.message)  # its ReLU is right: the run went on
        assert v.provenance["sandbox_level"] == "bwrap"
        refused = v.evidence.get("sandbox_refused", {})
        assert refused.get("child"), f"{name}: no refusal noted in the verdict"
    cpp = verdicts["19_ReLU__escape_cpp"].evidence["sandbox_refused"]
    assert any("append to the database" in line for line in cpp["child"] + cpp.get("build", []))


def test_nothing_escapes_as_root(scratch: Path) -> None:
    _require_full_isolation()
    if os.geteuid() != 0:
        pytest.skip("kbv is not running as root here")
    check_nothing_escaped(run_escape(scratch, "root", as_user=False))


def test_nothing_escapes_as_an_ordinary_user(scratch: Path) -> None:
    _require_full_isolation()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("becoming uid 65534 needs root and setpriv")
    check_nothing_escaped(run_escape(scratch, "user", as_user=True))
