"""How the operating system isolates a child: the probe, the choice, and the command line.

Every child that runs untrusted code (a candidate, its build, a baseline) is started through
`Isolation.command`, at one of these levels, strongest first:

- `bwrap`: bubblewrap puts the child in new mount, pid, network, IPC and UTS namespaces. Its view of
  the filesystem is read-only and holds only what it needs (system directories, the interpreter,
  kbv's code, the CUDA toolkit, the GPU's device nodes); its own working directory and its build's
  output directories are the only places it can write; private empty `/tmp` and `/dev/shm`. It sees
  no other process, no network but its own loopback, and dies with its parent. When kbv runs as
  root, bwrap runs as root (no user namespace needed) and the child drops to an unprivileged uid and
  gid itself (`kbv.sandbox.child`, before anything else), with every capability gone; as an ordinary
  user, bwrap makes a user namespace, and nested ones are refused (`--disable-userns`).
- `degraded`: no namespaces to be had, and kbv runs as root: the child runs as the unprivileged uid
  and relies on directory permissions (kbv's own files are root's; it writes only what was chowned
  to it). It can still see other processes and the network.
- `none`: nothing beyond a child process of kbv's own user (no namespaces, not root, or a path the
  unprivileged uid cannot reach).
- `off`: asked for (`--sandbox off`): as `none`, and said as loudly.

Every child of every level also gets resource limits (`LIMITS`, set by the child on itself: no core
dumps, bounded processes, file size and open files; no address-space limit, which CUDA's reservations
would trip).

The probe runs bubblewrap once per process on a trivial command (`probe`, cached). `resolve` turns a
`SandboxMode` into the `Isolation` of a run: `strict` raises `SandboxUnavailable` unless the level is
`bwrap`; `auto` takes the strongest available.

No seccomp filter is installed: bubblewrap takes a compiled BPF program, and no maintained Python
binding of libseccomp is available to the interpreters kbv runs on (the official bindings ship as
distribution packages of the system Python only). TODO: add one where such a binding is importable.

`KBV_BWRAP` names the bubblewrap binary (default: `bwrap` on PATH); an empty value or a path that is
not there makes the probe find none, as on a machine without it. `KBV_SANDBOX_USER` names the
unprivileged user children run as when kbv is root (default `nobody`, uid 65534).
"""

from __future__ import annotations

import enum
import functools
import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbv.errors import SandboxUnavailable, UsageError

PROBE_TIMEOUT_S = 10.0
DEFAULT_USER = "nobody"
# (resource, soft and hard limit) set by every child on itself. Threads count as processes, and a
# torch child starts one per core: NPROC leaves room for that on a large machine, and stops a fork bomb.
LIMITS: tuple[tuple[int, int], ...] = (
    (resource.RLIMIT_CORE, 0),  # no core dumps (a crash handler such as apport runs as root on the host)
    (resource.RLIMIT_FSIZE, 16 << 30),  # one file: an extension, a cache entry, never a disk filled at once
    (resource.RLIMIT_NOFILE, 8192),
)
# Processes (threads count) of the unprivileged uid, which only children use: set only when a child
# runs as that uid. As an ordinary user the count would include everything else the user runs.
NPROC_LIMIT = 16384
NAMESPACES = ("mount", "pid", "net", "ipc", "uts")
_SYSTEM_DIRS = ("/usr", "/etc", "/sys", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxMode(str, enum.Enum):
    """What `--sandbox` asks for."""

    STRICT = "strict"  # full isolation (bwrap) or the run fails at start
    AUTO = "auto"  # the strongest available; a warning when it is not full
    OFF = "off"  # none: children run as kbv's own user with its access (debugging only)

    @classmethod
    def parse(cls, value: str) -> SandboxMode:
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise UsageError(f"Unknown sandbox mode '{value}': expected strict, auto or off.") from None


class Level(str, enum.Enum):
    BWRAP = "bwrap"
    DEGRADED = "degraded"
    NONE = "none"
    OFF = "off"


@dataclass(frozen=True)
class Capability:
    """What this process can do (probed once): bwrap, and how it runs."""

    bwrap: str | None  # the binary, when it works
    privileged: bool  # bwrap runs as root and the child drops its uid itself
    reason: str  # why bwrap cannot be used ("" when it can)


@dataclass(frozen=True)
class Isolation:
    """How the children of a run are isolated. `uid`/`gid`: what a child runs as when it is not kbv's
    own user (kbv is root). `reason`: why it is not stronger."""

    level: Level
    uid: int | None = None
    gid: int | None = None
    bwrap: str | None = None
    privileged: bool = False
    reason: str = ""
    user: str = ""  # the name of `uid`, or of kbv's own user

    @property
    def full(self) -> bool:
        return self.level is Level.BWRAP

    @property
    def limits(self) -> bool:
        return self.level is not Level.OFF

    def describe(self) -> str:
        """One line: `sandbox: bwrap (uid 65534; mount, pid, net, ipc and uts namespaces)`."""
        spaces = ", ".join(NAMESPACES[:-1]) + f" and {NAMESPACES[-1]} namespaces"
        if self.level is Level.BWRAP:
            who = f"uid {self.uid}" if self.uid is not None else f"user namespace as uid {os.geteuid()}"
            return f"sandbox: bwrap ({who}; {spaces})"
        if self.level is Level.DEGRADED:
            return f"sandbox: degraded ({self.reason}): uid {self.uid}, directory permissions"
        if self.level is Level.NONE:
            return f"sandbox: none ({self.reason}): children run as {self.user} with kbv's own access"
        return f"sandbox: off (--sandbox off): children run as {self.user} with kbv's own access"

    def record(self) -> dict[str, Any]:
        """What a verdict's provenance keeps."""
        return {"sandbox": self.describe().removeprefix("sandbox: "), "sandbox_level": self.level.value}

    # -- a child's command line ------------------------------------------------------------------
    def command(self, argv: Sequence[str], view: ChildView) -> list[str]:
        """`argv` (the child's command) wrapped as this level runs it."""
        if self.level is not Level.BWRAP:
            return list(argv)
        assert self.bwrap is not None
        return [self.bwrap, *bwrap_arguments(view, privileged=self.privileged), "--", *argv]

    def popen_user(self, gpu: bool = False) -> dict[str, Any]:
        """Popen's user/group arguments: the drop to `uid` before exec (degraded); bwrap as root drops
        inside instead (`child_drop`). `gpu`: the groups of device nodes others cannot open are kept."""
        if self.level is Level.DEGRADED and self.uid is not None:
            return {"user": self.uid, "group": self.gid, "extra_groups": list(gpu_groups()) if gpu else []}
        return {}

    def child_drop(self) -> tuple[int, int] | None:
        """(uid, gid) the child drops to itself, first thing, inside bwrap run as root."""
        if self.level is Level.BWRAP and self.privileged and self.uid is not None:
            return (self.uid, self.gid if self.gid is not None else self.uid)
        return None

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who must own what the child writes (its directories, its output files), when not kbv."""
        if self.uid is None or self.level in (Level.NONE, Level.OFF):
            return None
        return (self.uid, self.gid if self.gid is not None else self.uid)


@dataclass(frozen=True)
class ChildView:
    """What one child must see: its writable directories, the files it reads, what it must not see."""

    work_dir: Path
    writable: tuple[Path, ...]  # besides the work dir (the build's output directories, the shared-memory arena)
    readable: tuple[Path, ...] = ()  # bound read-only (the build directory)
    hidden: tuple[Path, ...] = ()  # masked with an empty tmpfs where they lie inside a bound directory
    env_paths: tuple[str, ...] = ()  # PATH, PYTHONPATH, LD_LIBRARY_PATH... entries the child uses
    gpu: bool = False  # bind the NVIDIA device nodes


# -- the probe ---------------------------------------------------------------------------------------

def find_bwrap() -> str | None:
    """The bubblewrap binary: $KBV_BWRAP (empty: none), else `bwrap` on PATH."""
    named = os.environ.get("KBV_BWRAP")
    if named is not None:
        return named if named and os.access(named, os.X_OK) and not os.path.isdir(named) else None
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str | None, euid: int) -> Capability:
    if bwrap is None:
        return Capability(None, False, "bwrap not found" + (" (KBV_BWRAP)" if "KBV_BWRAP" in os.environ else ""))
    true = shutil.which("true") or "/bin/true"
    args = ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    privileged = euid == 0
    args += ["--cap-drop", "ALL"] if privileged else ["--unshare-user", "--disable-userns"]
    try:
        done = subprocess.run([bwrap, *args, "--", true], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Capability(None, False, f"bwrap does not run: {exc}")
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        return Capability(None, False, f"no namespaces: {message[-1] if message else f'bwrap exited {done.returncode}'}")
    return Capability(bwrap, privileged, "")


def probe() -> Capability:
    """Whether bwrap works here, and how (one trivial sandbox, once per process and binary)."""
    return _probe(find_bwrap(), os.geteuid())


def sandbox_user() -> tuple[int, int, str]:
    """(uid, gid, name) children run as when kbv is root: $KBV_SANDBOX_USER (a name or a uid), else
    `nobody` (65534)."""
    name = os.environ.get("KBV_SANDBOX_USER", DEFAULT_USER)
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if name.isdigit():
            return int(name), int(name), name
        if name == DEFAULT_USER:
            return 65534, 65534, "65534"
        raise UsageError(f"KBV_SANDBOX_USER={name}: no such user.") from None
    if entry.pw_uid == 0:
        raise UsageError(f"KBV_SANDBOX_USER={name}: children must not run as root.")
    return entry.pw_uid, entry.pw_gid, entry.pw_name


def resolve(mode: SandboxMode, paths: Iterable[Path] = ()) -> Isolation:
    """The isolation children get under `mode`. `paths`: directories children use (the run and cache
    directories), which a degraded child (no mount namespace) must be able to reach.
    Raises SandboxUnavailable under `strict` when the level would not be `bwrap`."""
    me = pwd.getpwuid(os.geteuid()).pw_name if _has_user(os.geteuid()) else str(os.geteuid())
    if mode is SandboxMode.OFF:
        return Isolation(Level.OFF, user=me)
    cap = probe()
    root = os.geteuid() == 0
    uid, gid, name = sandbox_user() if root else (None, None, me)
    if cap.bwrap is not None:
        return Isolation(Level.BWRAP, uid, gid, cap.bwrap, cap.privileged, user=name)
    if mode is SandboxMode.STRICT:
        raise SandboxUnavailable(f"--sandbox strict: full isolation cannot be had here ({cap.reason}); "
                                 "install bubblewrap and allow namespaces, or use --sandbox auto")
    if not root:
        return Isolation(Level.NONE, reason=f"{cap.reason}; not root, so no other uid", user=me)
    blocked = unreachable([*code_paths(), *paths], uid, gid)
    if blocked:
        return Isolation(Level.NONE, reason=f"{cap.reason}; uid {uid} cannot reach {blocked}", user=me)
    return Isolation(Level.DEGRADED, uid, gid, reason=cap.reason, user=name)


def check_strict(mode: SandboxMode, record: dict[str, Any]) -> None:
    """Raise SandboxUnavailable when `mode` is strict and `record` (`Isolation.record`, made where the
    children run: a Ray worker) is not full isolation."""
    if mode is SandboxMode.STRICT and record.get("sandbox_level") != Level.BWRAP.value:
        raise SandboxUnavailable(f"--sandbox strict: full isolation cannot be had where the children run "
                                 f"({record.get('sandbox')}); use --sandbox auto")


def _has_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


# -- what a child needs to see ---------------------------------------------------------------------

def interpreter() -> str:
    """The interpreter children (and kbv's compiler script) run: this one, its directories resolved, its
    own name kept. A virtual environment reached through a symbolic link (`.venv -> /elsewhere/venv`) is
    bound into bubblewrap's view under its real path only, where the link's path does not exist; and
    resolving the file itself would leave the environment for the interpreter it was made from (Python
    finds `pyvenv.cfg` beside the path it was started by, or one directory up). An environment whose
    `bin/` alone is a link to somewhere else would lose its `pyvenv.cfg` so: not a layout venv makes."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


@functools.lru_cache(maxsize=1)
def code_paths() -> tuple[str, ...]:
    """Directories every child reads: the interpreter, its standard library and site-packages, kbv's
    code, the CUDA toolkit. Outermost first, none inside another."""
    import site
    import sysconfig

    import kbv

    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), str(Path(kbv.__file__).resolve().parents[1])]
    found += [p for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib", "include")]
    found += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    # entries .pth files added (editable installs); the first entry is the script's directory or the cwd
    found += [p for p in sys.path[1:] if p and os.path.abspath(p) != os.getcwd()]
    nvcc = shutil.which("nvcc")
    found += [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""),
              str(Path(os.path.realpath(nvcc)).parents[1]) if nvcc else ""]
    return outermost(p for p in found if p)


_COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc")


def toolchain_paths(env: dict[str, str]) -> tuple[str, ...]:
    """The installation prefixes of the compilers a child's builds and JIT compilers run (`CC`, `CXX`,
    kbv's real compiler behind its header script, and those on the child's PATH): a compiler outside
    the system directories (say /opt/gcc/bin/gcc) runs its own programs and headers from its prefix
    (libexec/.../cc1, lib/gcc/.../include), which binding its PATH entry alone would leave out."""
    home = os.path.realpath(os.path.expanduser("~"))
    found: list[str] = []
    named = [env.get(k, "") for k in ("CC", "CXX", "KBV_REAL_CXX")]
    named += [shutil.which(c, path=env.get("PATH", "")) or "" for c in _COMPILERS]
    for exe in named:
        exe = exe.split()[0] if exe.strip() else ""
        if exe and not os.path.isabs(exe):
            exe = shutil.which(exe, path=env.get("PATH", "")) or ""
        if not exe:
            continue
        for path in {exe, os.path.realpath(exe)}:
            where = Path(path).parent
            prefix = where.parent if where.name == "bin" else where
            # never a prefix that is / or holds the user's home: that would bring all of it into view
            if str(prefix) != "/" and not home.startswith(str(prefix)):
                found.append(str(prefix))
    return outermost(found)


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """Existing directories of `paths` (resolved), without those inside another one of them."""
    dirs = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})
    kept: list[str] = []
    for d in dirs:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(d)
    return tuple(kept)


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def gpu_nodes() -> tuple[str, ...]:
    """The NVIDIA device nodes (and the MIG capability directory) of this machine."""
    dev = Path("/dev")
    return tuple(str(p) for p in sorted(dev.glob("nvidia*")) if p.is_char_device() or p.is_dir())


def gpu_groups() -> tuple[int, ...]:
    """Groups of NVIDIA device nodes that others may not read and write (a driver installed with
    `NVreg_DeviceFileMode=0660`, say): a child that drops its uid keeps these groups, and no other."""
    gids = set()
    for node in gpu_nodes():
        st = os.stat(node)
        if stat.S_ISCHR(st.st_mode) and st.st_mode & 0o006 != 0o006 and st.st_gid != 0:
            gids.add(st.st_gid)
    return tuple(sorted(gids))


def bwrap_arguments(view: ChildView, privileged: bool) -> list[str]:
    """bubblewrap's arguments for one child (see the module docstring for what they give)."""
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "kbv-sandbox", "--die-with-parent"]
    # bwrap as root keeps every capability unless told: the child needs two, to drop its uid and gid
    args += (["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
             if privileged else ["--unshare-user", "--disable-userns"])
    roots: list[str] = []
    made: set[str] = set()
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
            roots.append(d)
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
             "--perms", "1777", "--tmpfs", "/dev/shm"]
    made |= {"/tmp", "/dev", "/dev/shm"}
    for d in outermost([*code_paths(), *view.env_paths]):
        if not _inside(d, roots):
            args += [*_parents(d, made), "--ro-bind", d, d]
            roots.append(d)
    if view.gpu:
        for node in gpu_nodes():
            args += ["--dev-bind", node, node]
    for d in view.hidden:  # the run's database, other children's directories, other builds
        real = os.path.realpath(d)
        # masked where a bound directory shows it; one that holds a bound directory shows only that
        if os.path.isdir(real) and _inside(real, roots) and not any(_inside(r, [real]) for r in roots):
            args += [*_parents(real, made), "--tmpfs", real]
    for d in view.readable:
        args += [*_parents(str(d), made), "--ro-bind", os.path.realpath(d), str(d)]
    for d in (view.work_dir, *view.writable):
        args += [*_parents(str(d), made), "--bind", os.path.realpath(d), str(d)]
    return [*args, "--chdir", str(view.work_dir)]


def _parents(path: str, made: set[str]) -> list[str]:
    """`--dir` for each directory above `path`, searchable by all: bwrap makes the missing ones 0700,
    which an unprivileged child could not pass. An existing one is left as it is."""
    args: list[str] = []
    for parent in reversed(Path(path).parents[:-1]):
        if str(parent) not in made:
            made.add(str(parent))
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


# -- directories a child owns ------------------------------------------------------------------------

def give(paths: Iterable[Path], owner: tuple[int, int] | None) -> None:
    """Make `paths` (and what is in them) the child's: owned by `owner` (None: kbv's own user, nothing
    to do). What is already the child's is left alone."""
    if owner is None:
        return
    uid, gid = owner
    for top in paths:
        if top.is_dir():  # bwrap, root without its capabilities, must still pass it (0700 would stop it)
            os.chmod(top, stat.S_IMODE(top.stat().st_mode) | 0o711)
        for path in (top, *top.rglob("*")) if top.is_dir() else (top,):
            try:
                st = path.lstat()
                if (st.st_uid, st.st_gid) != (uid, gid):
                    os.lchown(path, uid, gid)
            except FileNotFoundError:
                continue


def unreachable(paths: Iterable[str | Path], uid: int | None, gid: int | None) -> str:
    """The first of `paths` that `uid`/`gid` cannot reach (search every directory on the way, read
    the last), described as `PATH (DIR is 0700)`; '' when all are reachable."""
    if uid is None:
        return ""
    for target in paths:
        real = Path(os.path.realpath(target))
        for d in [*reversed(real.parents), real]:
            try:
                st = d.stat()
            except OSError:
                break  # made later by kbv, as kbv's own
            need = stat.S_IXOTH | (stat.S_IROTH if d == real else 0)
            bits = (st.st_mode >> 6 & 7) if st.st_uid == uid else (st.st_mode >> 3 & 7) if st.st_gid == gid else st.st_mode & 7
            if bits & need != need:
                return f"{target} ({d} is {stat.S_IMODE(st.st_mode):04o})"
    return ""


# What a refused write, connect or read prints (strerror of EACCES, EPERM, EROFS and the network's).
_REFUSED = ("Permission denied", "Operation not permitted", "Read-only file system", "Network is unreachable",
            "Connection refused", "Cannot assign requested address", "EACCES", "EPERM", "EROFS", "ENETUNREACH",
            "ECONNREFUSED")


def refusals(text: str, limit: int = 20) -> list[str]:
    """The lines of a child's output that show the operating system refusing it something: evidence
    that it tried (what matters is that nothing got through, which the sandbox holds either way)."""
    lines = [line.strip()[:300] for line in text.splitlines() if any(m in line for m in _REFUSED)]
    return list(dict.fromkeys(lines))[:limit]


def apply_limits(nproc: bool) -> None:
    """The child's resource limits (`LIMITS`, and `NPROC_LIMIT` when `nproc`), never above what it
    already has."""
    for res, value in LIMITS + (((resource.RLIMIT_NPROC, NPROC_LIMIT),) if nproc else ()):
        soft, hard = resource.getrlimit(res)
        new_hard = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (min(new_hard, soft) if soft != resource.RLIM_INFINITY else new_hard, new_hard))
