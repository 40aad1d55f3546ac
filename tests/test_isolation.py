"""How children are isolated (`kbv.sandbox.isolation`): the probe, the levels a run can get, what it
says about them, and `--sandbox strict` where full isolation cannot be had.

A machine without bubblewrap is simulated honestly with KBV_BWRAP="" (the probe then finds none, as
on such a machine); namespaces that are refused show the same way, through the probe's own run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import kbv
from kbv.errors import UsageError
from kbv.sandbox.isolation import (
    ChildView,
    Isolation,
    Level,
    SandboxMode,
    SandboxUnavailable,
    code_paths,
    probe,
    refusals,
    resolve,
    unreachable,
)
from sources import RELU_PROBLEM, write_tree

SRC = Path(kbv.__file__).resolve().parents[1]

WHO_AM_I = textwrap.dedent('''\
    import os
    import sys
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            run = os.path.dirname(os.path.dirname(os.getcwd()))  # RUN/work/<child>
            try:
                open(os.path.join(run, "kbv.sqlite"), "ab").close()
                db = "appended"
            except OSError as exc:
                db = exc.strerror
            raise RuntimeError(f"uid={os.getuid()} gid={os.getgid()} groups={os.getgroups()} db={db}")
''')


def _kbv(tmp: Path, *extra: str, env: dict[str, str] | None = None,
         wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`kbv eval` on one candidate that reports who it runs as, standard protocol, on CPU."""
    write_tree(tmp / "problems", {"level1/19_ReLU.py": RELU_PROBLEM})
    write_tree(tmp / "candidates", {"19_ReLU__whoami.py": WHO_AM_I})
    cmd = [sys.executable, "-m", "kbv", "eval", str(tmp / "candidates"), "--problems", str(tmp / "problems"),
           "--protocol", "standard", "--device", "cpu", "--run", str(tmp / "run"), "--cache-dir", str(tmp / "cache"),
           "--format", "json", *extra]
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([*(wrap or []), *cmd], env=full_env, capture_output=True, text=True, timeout=600)


# -- what a run says ------------------------------------------------------------------------------

def test_each_level_says_what_holds_in_one_line() -> None:
    assert (Isolation(Level.BWRAP, 65534, 65534, "/usr/bin/bwrap", True).describe()
            == "sandbox: bwrap (uid 65534; mount, pid, net, ipc and uts namespaces)")
    assert Isolation(Level.BWRAP, bwrap="/usr/bin/bwrap").describe().startswith("sandbox: bwrap (user namespace as uid ")
    assert (Isolation(Level.DEGRADED, 65534, 65534, reason="no namespaces: x").describe()
            == "sandbox: degraded (no namespaces: x): uid 65534, directory permissions")
    assert (Isolation(Level.NONE, reason="bwrap not found", user="alice").describe()
            == "sandbox: none (bwrap not found): children run as alice with kbv's own access")
    assert Isolation(Level.OFF, user="root").describe().startswith("sandbox: off (--sandbox off)")
    assert Isolation(Level.BWRAP, 65534, 65534, "b", True).record() == {
        "sandbox": "bwrap (uid 65534; mount, pid, net, ipc and uts namespaces)", "sandbox_level": "bwrap"}


def test_an_unknown_mode_is_a_one_line_usage_error() -> None:
    with pytest.raises(UsageError, match="Unknown sandbox mode 'tight': expected strict, auto or off."):
        SandboxMode.parse("tight")


def test_the_probe_runs_once_per_process_and_binary() -> None:
    first = probe()
    assert probe() is first  # cached
    os.environ["KBV_BWRAP"] = ""
    missing = probe()
    assert missing.bwrap is None and missing.reason == "bwrap not found (KBV_BWRAP)"


def test_only_bwrap_wraps_the_command_and_only_it_unshares(tmp_path: Path) -> None:
    view = ChildView(work_dir=tmp_path / "work", writable=(tmp_path / "build" / "out",), readable=(tmp_path / "build",),
                     hidden=(tmp_path,))
    argv = ["python", "-m", "kbv.sandbox.child", "3", "4", "5"]
    assert Isolation(Level.DEGRADED, 65534, 65534).command(argv, view) == argv
    wrapped = Isolation(Level.BWRAP, 65534, 65534, "/usr/bin/bwrap", privileged=True).command(argv, view)
    assert wrapped[0] == "/usr/bin/bwrap" and wrapped[-len(argv) - 1:] == ["--", *argv]
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"):
        assert flag in wrapped
    assert ["--cap-drop", "ALL"] == wrapped[wrapped.index("--cap-drop"):wrapped.index("--cap-drop") + 2]
    pairs = list(zip(wrapped, wrapped[1:], wrapped[2:]))
    assert ("--bind", str(tmp_path / "work"), str(tmp_path / "work")) in pairs  # its own: writable
    assert ("--ro-bind", str(tmp_path / "build"), str(tmp_path / "build")) in pairs  # its source: read-only
    assert not any(a == "--bind" and b == "/" for a, b, _ in pairs)  # never the whole filesystem
    user = Isolation(Level.BWRAP, bwrap="/usr/bin/bwrap").command(argv, view)
    assert "--unshare-user" in user and "--disable-userns" in user and "--cap-add" not in user


def test_unreachable_names_the_directory_that_stops_the_uid() -> None:
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own base directory is 0700
    try:
        os.chmod(base, 0o755)
        closed = base / "closed"
        (closed / "inner").mkdir(parents=True)
        os.chmod(closed, 0o700)
        assert unreachable([closed / "inner"], 65534, 65534) == f"{closed / 'inner'} ({closed} is 0700)"
        os.chmod(closed, 0o751)  # searchable by others, not listable: enough to pass, not to read
        assert unreachable([closed / "inner"], 65534, 65534) == ""
        assert unreachable([closed], 65534, 65534) == f"{closed} ({closed} is 0751)"
        assert unreachable([closed], None, None) == ""  # no other uid: nothing to check
    finally:
        shutil.rmtree(base)


def test_refusals_keep_the_lines_that_show_the_os_saying_no() -> None:
    text = ("compiling...\nkbv-escape: write /x: Permission denied\nok\n"
            "OSError: [Errno 30] Read-only file system: '/y'\nkbv-escape: write /x: Permission denied\n")
    assert refusals(text) == ["kbv-escape: write /x: Permission denied", "OSError: [Errno 30] Read-only file system: '/y'"]


# -- what a run does ------------------------------------------------------------------------------

def test_strict_fails_at_start_with_one_line_where_bwrap_is_missing(tmp_path: Path) -> None:
    done = _kbv(tmp_path, "--sandbox", "strict", env={"KBV_BWRAP": ""})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: --sandbox strict: full isolation cannot be had here (bwrap not found (KBV_BWRAP)); "
                     "install bubblewrap and allow namespaces, or use --sandbox auto"]
    assert not (tmp_path / "run" / "kbv.sqlite").exists()  # nothing ran


def test_strict_raises_from_the_api_too() -> None:
    os.environ["KBV_BWRAP"] = ""
    with pytest.raises(SandboxUnavailable):
        resolve(SandboxMode.STRICT)


def test_without_bwrap_auto_warns_and_the_run_goes_on(tmp_path: Path) -> None:
    done = _kbv(tmp_path, env={"KBV_BWRAP": ""})
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("warning: sandbox: ") and "bwrap not found" in first, first
    assert '"status": "runtime_error"' in done.stdout  # the candidate's report is a verdict


def test_off_is_said_loudly(tmp_path: Path) -> None:
    done = _kbv(tmp_path, "--sandbox", "off")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith("warning: sandbox: off (--sandbox off): children run as ")
    assert '"sandbox_level": "off"' in done.stdout  # and every verdict records it


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bwrap (to show the "
                    "interpreter, which may live in root's closed home, to uid 65534)")
def test_degraded_children_run_as_the_unprivileged_uid_without_the_database(tmp_path: Path) -> None:
    """No namespaces for the children (KBV_BWRAP=""), kbv as root: each child runs as uid 65534 with no
    groups and cannot write the run's database. kbv itself runs in a mount namespace where root's home
    shows only the interpreter's directories (searchable), as on a machine where it lives elsewhere."""
    under_root = [p for p in code_paths() if p.startswith("/root/")]
    dirs = sorted({str(d) for p in under_root for d in Path(p).parents if str(d).startswith("/root/")})
    wrap = ["bwrap", "--dev-bind", "/", "/", "--perms", "0755", "--tmpfs", "/root",
            *[a for d in dirs for a in ("--perms", "0755", "--dir", d)],
            *[a for p in under_root for a in ("--ro-bind", p, p)], "--"]
    base = Path("/tmp") / f"kbv-degraded-{os.getpid()}"  # pytest's tmp_path is 0700: 65534 could not reach it
    base.mkdir(mode=0o755)
    try:
        done = _kbv(base, env={"KBV_BWRAP": ""}, wrap=wrap)
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith("warning: sandbox: degraded (bwrap not found (KBV_BWRAP)): uid 65534, "
                                      "directory permissions"), done.stderr
        assert "uid=65534 gid=65534 groups=[] db=Permission denied" in done.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


USES_ITS_COMPILER = textwrap.dedent('''\
    import os
    import subprocess
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            done = subprocess.run([os.environ["CC"], "--version"], capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"the compiler failed: {done.stderr.strip()}")
            return torch.relu(x)
''')


@pytest.mark.skipif(probe().bwrap is None and not os.environ.get("KBV_REQUIRE_SANDBOX"),
                    reason="needs bubblewrap with namespaces")
def test_a_compiler_installed_under_its_own_prefix_runs_whole_in_the_sandbox(tmp_path: Path) -> None:
    """A machine whose compiler lives outside the system directories (`CC=/opt/gcc/bin/gcc`, as on
    our GPU machine) and runs programs of its own prefix (`libexec/.../cc1`): the child sees the whole
    prefix, not only the PATH entry, so Triton's launcher and nvcc's host compiler work there."""
    prefix = tmp_path / "toolchain"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "libexec").mkdir()
    real = prefix / "libexec" / "cc1-real"
    real.write_text("#!/bin/sh\necho 'kbv test compiler 1.0'\n")
    driver = prefix / "bin" / "gcc"
    driver.write_text('#!/bin/sh\nexec "$(dirname "$0")/../libexec/cc1-real" "$@"\n')
    for exe in (real, driver):
        exe.chmod(0o755)
    for d in (tmp_path, prefix, prefix / "bin", prefix / "libexec"):
        d.chmod(0o755)  # the child runs as another uid under root
    write_tree(tmp_path / "problems", {"level1/19_ReLU.py": RELU_PROBLEM})
    write_tree(tmp_path / "candidates", {"19_ReLU__own_compiler.py": USES_ITS_COMPILER})
    cmd = [sys.executable, "-m", "kbv", "eval", str(tmp_path / "candidates"), "--problems", str(tmp_path / "problems"),
           "--protocol", "standard", "--device", "cpu", "--run", str(tmp_path / "run"),
           "--cache-dir", str(tmp_path / "cache"), "--format", "json", "--sandbox", "strict"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "CC": str(driver)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert '"status": "correct"' in done.stdout, done.stdout
