"""Parent side of the trust boundary: start a child, talk to it, kill it.

A `Sandbox` is one spawned child process (`python -m kbv.sandbox.child`) in its own process group,
working directory and scrubbed environment, isolated by the operating system as its `Isolation`
says (`kbv.sandbox.isolation`: bubblewrap's namespaces and an unprivileged uid where they can be
had). `call` sends a command and waits for the reply under a wall-clock deadline; a child that dies,
hangs or breaks the protocol surfaces as `ChildFailure` with the status it deserves and the tail of
its stderr. The child's stdout and stderr are drained by threads and only their tails are kept.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kbv.errors import SandboxError
from kbv.gate import checkpoint
from kbv.sandbox.channel import ChannelError, DeviceChannel, HostChannel, Receipt, device_channel_supported
from kbv.sandbox.isolation import (
    ChildView,
    Isolation,
    SandboxMode,
    give,
    gpu_groups,
    interpreter,
    refusals,
    resolve,
    toolchain_paths,
)
from kbv.sandbox.oom import kill_count, make_first_choice
from kbv.sandbox.wire import (
    SharedArena,
    WireClosed,
    WireTimeout,
    decode_reply,
    read_frame,
    send_command,
)
from kbv.verdict import Status

TAIL_BYTES = 16 * 1024
# False: every child starts with address-space layout randomisation off (`--aslr off`). A bench's
# setting (bench/identity_eval.py's no-aslr variant): two alike children have timed a launch-bound
# call 15% apart, and each process's own layout is one suspect.
CHILD_ASLR = True
STARTUP_OPS = ("ping", "hello")  # a child that dies at one of these, before answering anything, ran no candidate code

# What each reply must hold. A reply that lacks it came from a broken or forged result channel
# (the candidate can write to it): the pair fails as `crashed`, the run goes on.
_EXPECTED = {
    "hello": ("pid",), "ping": ("pid",), "build": ("built",), "load": ("loaded",), "forward": ("outputs", "count", "copied"),
    "time": ("samples_ms",), "pool": ("sets",), "warmup": ("calls",), "time_block": ("device_ms", "host_ms"),
    "memory": ("peak_bytes", "retained_bytes"), "replay": ("pairs",), "bandwidth": ("gbps",),
    "attribution": ("wall_ms", "kernels", "launches", "ghost", "ghost_copied"), "alloc": ("slot", "size", "offsets"),
}

# Variables a child may inherit. Everything else (API keys, seeds, user settings) is dropped.
_INHERITED = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CC", "CXX",
              "PYTHONPATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH")
_INHERITED_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")


@dataclass(frozen=True)
class ChildSpec:
    """Where and how a child runs."""

    work_dir: Path  # cwd, HOME and TMPDIR of the child
    build_dir: Path  # TORCH_EXTENSIONS_DIR and TRITON_CACHE_DIR live here
    device: str  # "cpu" or "cuda:N" as the child sees it
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES for the child
    cuda_arch_list: str | None = None  # TORCH_CUDA_ARCH_LIST (builds on CPU workers need it)
    parent_device: str | None = None  # the child's GPU in the parent's numbering ("cuda:N"), for copies
    isolation: Isolation | None = None  # None: the strongest this process can have (`--sandbox auto`)
    hidden: tuple[Path, ...] = ()  # never in the child's view: the run directory, the build cache
    extra_env: tuple[tuple[str, str], ...] = ()  # set by kbv for builds (`Settings.compile_env`, MAX_JOBS)
    cpus: tuple[int, ...] = ()  # where the child runs once its device comes up (a lane's: `kbv.placement`)

    def build_outputs(self) -> tuple[Path, Path]:
        """The directories of the build the child writes: compiled extensions and Triton's cache."""
        return self.build_dir / "torch_extensions", self.build_dir / "triton"


def child_env(spec: ChildSpec) -> dict[str, str]:
    """The scrubbed environment of a child."""
    env = {k: v for k, v in os.environ.items() if k in _INHERITED or k.startswith(_INHERITED_PREFIXES)}
    # kbv itself must import in the child even when run from a source tree (PYTHONPATH=src)
    paths = [str(Path(__file__).resolve().parents[2])]
    paths += [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    tmp = spec.work_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update({
        "HOME": str(spec.work_dir),
        "TMPDIR": str(tmp),
        "TORCH_EXTENSIONS_DIR": str(spec.build_outputs()[0]),
        "TRITON_CACHE_DIR": str(spec.build_outputs()[1]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # children take turns on the cores: an idle one's spinning OpenMP workers would slow the one
        # being timed (the interleaved timer keeps two alive at once)
        "OMP_WAIT_POLICY": "PASSIVE",
        "KBV_DEVICE": spec.device,
    })
    if spec.device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run on the CPU through its interpreter
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif spec.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec.visible_devices
    if spec.cuda_arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = spec.cuda_arch_list
    env.update(dict(spec.extra_env))
    return env


def _hide_from_children() -> None:
    """Make this process non-dumpable, so a process of the same user cannot read its
    /proc/<pid>/environ or memory (where a child is not in a pid namespace of its own, or as
    another uid, this is what keeps them from it)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # started children, for `kill_all_children`


def kill_all_children() -> int:
    """Kill the process group of every child this process started and has not closed (an interrupted
    run must leave nothing behind). Returns how many were killed. Safe from any thread."""
    killed = 0
    for sb in list(_LIVE):
        if sb.proc is not None and sb.proc.poll() is None:
            sb.killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sb.proc.pid, signal.SIGKILL)
                killed += 1
    return killed


def _freed(device: Any, before: int, settle_s: float = 2.0) -> int:
    """The device's free memory once a killed child's has come back: read until it stops rising
    (two readings alike) or `settle_s` passes (the driver frees a process's memory as it exits)."""
    import torch

    deadline = time.monotonic() + settle_s
    last = int(torch.cuda.mem_get_info(device)[0])
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = int(torch.cuda.mem_get_info(device)[0])
        if now == last and now > before:
            break
        last = now
    return last


# A candidate's child that held under this share of the device when kbv's own buffer found no room
# there did not fill it (`Sandbox._no_room`); the slack allows for the driver's granularity.
ROOM_SHARE = 0.25
ROOM_SLACK_BYTES = 256 << 20


class ChildFailure(Exception):
    """The child cannot answer: it crashed, timed out, or reported a failure of the candidate."""

    def __init__(self, status: Status, message: str, evidence: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.evidence = evidence


class _Tail:
    """Keeps the last bytes of a stream, drained by a daemon thread."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.total = 0
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(65536), b""):
                with self._lock:
                    self.total += len(chunk)
                    self._buf += chunk
                    del self._buf[:-TAIL_BYTES]

    def text(self, wait_s: float = 0.0) -> str:
        if wait_s:
            self._thread.join(wait_s)
        with self._lock:
            return self._buf.decode("utf-8", errors="replace")


class Sandbox:
    """One child process. Use as a context manager; `close` always kills the process group."""

    def __init__(self, spec: ChildSpec, label: str = "") -> None:
        self.spec = spec
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}  # the child's hello
        self.channel: HostChannel | DeviceChannel | None = None
        self._cmd_w = -1
        self._res_r = -1
        self._fds: socket.socket | None = None  # descriptors of device exports come through here
        self.isolation = spec.isolation or resolve(SandboxMode.AUTO)
        self.arena: SharedArena | None = None  # host tensors for this child (the CPU channel)
        self.oom_kills: int | None = None  # the host's out-of-memory kills as the last command began (`kbv.sandbox.oom`)
        self.first_choice = False  # the parent has made every process of it the out-of-memory killer's first choice
        self.killed = False  # kbv killed it (a timeout, an interrupted run): no death of its own to explain

    def start(self) -> None:
        """Spawn the child (it imports torch and waits); `ready` brings up its device."""
        _hide_from_children()
        iso, spec = self.isolation, self.spec
        env = child_env(spec)  # makes the work dir and its tmp/
        spec.build_dir.mkdir(parents=True, exist_ok=True)
        for d in spec.build_outputs():
            d.mkdir(exist_ok=True)
        give((spec.work_dir, *spec.build_outputs()), iso.owner)
        self.arena = SharedArena(owner=iso.owner)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                iso.command(self._child_argv(cmd_r, res_w, theirs.fileno()), self._view(env)),
                pass_fds=(cmd_r, res_w, theirs.fileno()), cwd=spec.work_dir, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, **iso.popen_user(gpu=spec.device != "cpu"),
            )
        except OSError as exc:
            mine.close()
            self.arena.close()
            raise SandboxError(f"cannot start a sandbox child ({iso.describe()}): {exc}") from exc
        finally:
            os.close(cmd_r)
            os.close(res_w)
            theirs.close()
        self._cmd_w, self._res_r, self._fds = cmd_w, res_r, mine
        _LIVE.add(self)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.stdout = _Tail(self.proc.stdout)
        self.stderr = _Tail(self.proc.stderr)
        self.started_at = time.monotonic()

    def _child_argv(self, cmd_r: int, res_w: int, sock: int) -> list[str]:
        argv = [interpreter(), "-m", "kbv.sandbox.child", str(cmd_r), str(res_w), str(sock)]
        iso = self.isolation
        if not iso.full:  # in a pid namespace of its own the child's parent is bwrap's, not this pid
            argv += ["--parent", str(os.getpid())]
        drop = iso.child_drop()
        if drop is not None:
            groups = ",".join(str(g) for g in gpu_groups()) if self.spec.device != "cpu" else ""
            argv += ["--drop", f"{drop[0]}:{drop[1]}" + (f":{groups}" if groups else "")]
        if iso.limits:
            argv += ["--limits", "nproc" if iso.owner is not None else "basic"]
        if not CHILD_ASLR:
            argv += ["--aslr", "off"]
        return argv

    def _view(self, env: dict[str, str]) -> ChildView:
        """What the child sees in bwrap: its directories, its arena, the paths its environment names."""
        spec = self.spec
        assert self.arena is not None
        paths = [p for k in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH") for p in env.get(k, "").split(os.pathsep)]
        paths += [os.path.dirname(env.get("TRITON_PTXAS_PATH", ""))]
        home = os.path.realpath(os.path.expanduser("~"))
        # a PATH entry that holds the user's home (or is /) would bring all of it into view
        paths = [p for p in paths if p and os.path.isabs(p) and not home.startswith(os.path.realpath(p))]
        paths += toolchain_paths(env)
        others = (spec.work_dir.parent, spec.build_dir.parent)  # sibling children's and builds' directories
        # the shared precompiled headers and the compiler script (kbv.pch): read-only, so that no
        # candidate plants a header or a compiler that later builds would use
        shared = tuple(Path(env[k]) for k in ("KBV_PCH_DIR",) if env.get(k) and os.path.isdir(env[k]))
        return ChildView(work_dir=spec.work_dir, writable=(*spec.build_outputs(), self.arena.dir),
                         readable=(spec.build_dir, *shared), hidden=tuple(dict.fromkeys((*spec.hidden, *others))),
                         env_paths=tuple(paths), gpu=spec.device != "cpu")

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Bring up the child's device and guards (`hello`) and pick the tensor channel. Idempotent."""
        if self.channel is None:
            hello: dict[str, Any] = {"op": "hello"}
            if self.spec.cpus:  # the child moves itself, all its threads, before its device comes up
                hello["cpus"] = list(self.spec.cpus)
            self.info = self.call(hello, timeout_s)
            if self.spec.cpus and self.info.get("cpus") != sorted(self.spec.cpus) and self.proc is not None:
                from kbv.placement import move_process  # the child could not: the parent moves its tree

                move_process(self.proc.pid, frozenset(self.spec.cpus))
            import torch

            device = torch.device(self.spec.parent_device or "cuda:0") if self.spec.device != "cpu" else None
            if device is not None and self.info.get("vmm") and device_channel_supported(device):
                assert self._fds is not None
                self.channel = DeviceChannel(self._fds, device)
            else:
                assert self.arena is not None
                self.channel = HostChannel(self.arena)
        return self.info

    # -- tensors across the boundary (see kbv.sandbox.channel) --------------------------------------
    def put(self, values: Any, timeout_s: float) -> list[Any]:
        """`values` ready for a command: tensors handed to the child, the rest as they are."""
        try:
            return self._channel().put(self, list(values), timeout_s)
        except ChannelError as exc:
            self.kill()
            raise ChildFailure(Status.CRASHED, f"tensor transfer failed: {exc}", self.evidence()) from None

    def expect(self, like: Any) -> tuple[dict[str, Any], Receipt]:
        """Command fields that ask for outputs shaped like `like`, and their receipt for `take`."""
        return self._channel().expect(list(like))

    def take(self, reply: dict[str, Any], receipt: Receipt, timeout_s: float = 30.0) -> Any:
        """The parent's own copies of the outputs a reply delivered (None when it delivered none)."""
        try:
            return self._channel().take(self, reply, receipt, timeout_s)
        except ChannelError as exc:
            self.kill()
            raise ChildFailure(Status.CRASHED, f"tensor transfer failed: {exc}", self.evidence()) from None

    def _channel(self) -> HostChannel | DeviceChannel:
        if self.channel is None:
            self.ready(120.0)
        assert self.channel is not None
        return self.channel

    def call(self, command: dict[str, Any], timeout_s: float,
             paused: Callable[[], float] | None = None) -> dict[str, Any]:
        """Send `command`; return the reply. Raises ChildFailure (crash, timeout, candidate error).
        `paused`: a clock of the seconds the child has been held stopped (`kbv.placement.Holds`),
        which do not count against `timeout_s`."""
        if self.proc is None:
            raise SandboxError("sandbox not started")
        checkpoint()  # between two commands: a timed window of another pair on the device goes first
        deadline = time.monotonic() + timeout_s
        self.oom_kills = kill_count()
        try:
            send_command(self._cmd_w, command)
            if paused is not None:
                deadline = self._await_reply(deadline, paused)
            reply = decode_reply(read_frame(self._res_r, deadline))
        except WireTimeout:
            self.kill()
            raise ChildFailure(Status.TIMEOUT, f"no answer within {timeout_s:.3g} s ({command['op']})",
                               self.evidence()) from None
        except (WireClosed, BrokenPipeError, ValueError) as exc:
            raise self._death(command["op"], exc) from None
        if "error" in reply and isinstance(reply["error"], dict):
            raise self._candidate_error(reply["error"], command["op"])
        missing = [k for k in _EXPECTED.get(command["op"], ()) if k not in reply]
        if not reply.get("ok") or missing:
            self.kill()
            raise ChildFailure(Status.CRASHED, f"malformed reply to {command['op']} (missing {', '.join(missing) or 'ok'}): "
                               "the result channel was written by something other than the harness", self.evidence())
        if not self.first_choice:  # its first command (ping, hello): no candidate code has run in it yet
            make_first_choice(self._group())
            self.first_choice = True
        return reply

    def _await_reply(self, deadline: float, paused: Callable[[], float]) -> float:
        """Wait until a reply begins, the deadline moving on by the time spent held; the deadline
        for the rest of the reply."""
        held_at_start = paused()
        while True:
            limit = deadline + paused() - held_at_start
            remaining = limit - time.monotonic()
            if remaining <= 0:
                raise WireTimeout()
            ready, _, _ = select.select([self._res_r], [], [], min(remaining, 1.0))
            if ready:
                return max(limit, time.monotonic() + 10.0)

    def started(self, timeout_s: float, paused: Callable[[], float] | None = None) -> None:
        """Wait until the spawned child has imported torch and reads commands (it answers `ping`
        before bringing up any device)."""
        self.call({"op": "ping"}, timeout_s, paused)

    def cpu_seconds(self) -> float | None:
        """CPU-seconds used so far by the child's process group (the child, and bwrap and its init
        around it in a sandbox) and by the processes they have waited for (a build's ninja and
        compilers), from /proc; None where unknown. Each member counts its own time and its reaped
        children's, so nothing counts twice."""
        stats = self._group_stats()
        if not stats:
            return None
        ticks = sum(sum(int(fields[i]) for i in (11, 12, 13, 14)) for fields in stats.values())  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def _group(self) -> list[int]:
        """The processes of the child's process group (the child, and bwrap and its init around it)."""
        return list(self._group_stats())

    def _group_stats(self) -> dict[int, list[str]]:
        """/proc/PID/stat's fields after the command name, for each process of the child's group."""
        if self.proc is None:
            return {}
        found = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid:  # its process group (the child's session leader)
                    found[int(stat.parent.name)] = fields
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
        return found

    def _death(self, op: str, exc: BaseException) -> ChildFailure:
        assert self.proc is not None
        try:
            code, peak_rss = self._reap(5.0)
        except subprocess.TimeoutExpired:
            self.kill()
            return ChildFailure(Status.CRASHED, f"the child broke the protocol during {op}: {exc}", self.evidence())
        if self.isolation.full and code > 128 and code - 128 in signal.Signals._value2member_map_:
            code = 128 - code  # bwrap exits 128 + N for a child killed by signal N
        evidence = self.evidence(returncode=code)
        if peak_rss is not None:
            evidence["child_peak_rss_bytes"] = peak_rss
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            msg = f"killed by {name} during {op}"
            now, before = kill_count(), self.oom_kills
            if code == -signal.SIGKILL and not self.killed and now is not None and before is not None and now > before:
                msg = (f"killed by the kernel's out-of-memory killer during {op}: the host ran out of memory, "
                       "and kbv makes its children the killer's first choice")
                evidence["host_oom_kills"] = now - before
        else:
            msg = f"exited with code {code} during {op}, before answering"
            said = [ln.strip() for ln in evidence["stderr_tail"].splitlines() if ln.strip()]
            if op in STARTUP_OPS and not self.first_choice and said:  # no candidate code has run: the start-up's own words
                msg += f": {said[-1][:300]}"
        return ChildFailure(Status.CRASHED, msg, evidence)

    def _reap(self, timeout_s: float) -> tuple[int, int | None]:
        """Wait for the exited child: its exit code (as Popen gives it) and the peak resident bytes of
        its process tree (the largest process's, bubblewrap's and the kbv child's included), read from
        the kernel's account of it (`wait4`); None where another waiter reaped it first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (Popen's own wait)
                return self.proc.wait(timeout=max(deadline - time.monotonic(), 0.01)), None
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, int(usage.ru_maxrss) * 1024  # Linux reports KiB
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.proc.args, timeout_s)
            time.sleep(0.01)

    def _candidate_error(self, err: dict[str, Any], op: str) -> ChildFailure:
        kind = err.get("kind")
        if kind == "room" and isinstance(self.channel, DeviceChannel):
            return self._no_room(err, op)
        status = {"compile": Status.COMPILE_ERROR, "cuda": Status.CUDA_ERROR}.get(kind, Status.RUNTIME_ERROR)
        if kind not in ("compile", "cuda", "runtime"):
            # only the harness says "harness", and only for a command it does not know; kbv sends none
            # such, so this frame was forged: the candidate is judged, the run goes on
            self.kill()
            return ChildFailure(Status.CRASHED, f"the child answered {op} with a {kind!r} error: "
                                "the result channel was written by something other than the harness",
                                self.evidence())
        name, text = str(err.get("type", "Error")), str(err.get("message", ""))
        message = (f"{name}: {text}" if name else text).strip()  # no name: the harness's own words
        evidence = self.evidence()
        evidence["traceback"] = str(err.get("traceback", ""))[-8000:]
        if status is Status.CUDA_ERROR:
            self.kill()  # a child is never reused after a device error
        return ChildFailure(status, f"{message.splitlines()[0][:300] if message else kind} (during {op})", evidence)

    def _no_room(self, err: dict[str, Any], op: str) -> Exception:
        """The child found no room on the device for a buffer of kbv's own. Whose memory filled it is
        measured, not taken from the child: the device's free memory before and after the child is
        killed (it is never reused after a device error) is what the child held. Where that is under
        ROOM_SHARE of the device or under what the others held (the parent's problems, other
        processes), the device really was short of the buffer, and the buffer would have fit beside
        the child's own memory, the memory is others': DeviceRoomFailure, no verdict, the pair tried
        again. Otherwise the candidate's child filled the device itself: its `cuda_error`, with the
        figures. (A child that forges the frame without the device being short is judged; one that
        forges it while others fill the device only has its pair tried again, never passed.)
        A candidate's own out-of-memory error stays its `runtime_error`: the size it asks for is its
        own to choose, so a measure of it here would let a candidate turn any failure into no verdict."""
        import torch

        from kbv.errors import DeviceRoomFailure
        from kbv.footprint import format_bytes

        assert isinstance(self.channel, DeviceChannel)
        device = self.channel.device
        free_before, total = torch.cuda.mem_get_info(device)
        self.kill()
        free_after = _freed(device, free_before)
        held = max(free_after - free_before, 0)
        needed = err.get("needed_bytes")
        needed = needed if isinstance(needed, int) and needed > 0 else 0
        message = str(err.get("message", "")).splitlines()[0][:300] if err.get("message") else "no room on the device"
        others = max(total - free_before - held, 0)
        figures = (f"the candidate's child held {format_bytes(held)} of the device's {format_bytes(total)}, "
                   f"others {format_bytes(others)}")
        # others' doing: the child held little next to them, the device was short of the request, and the
        # request would have fit beside what the child held had the others not been there
        if held < max(ROOM_SHARE * total, others) and free_before < needed + ROOM_SLACK_BYTES \
                and held + needed <= total:
            return DeviceRoomFailure(f"{message} (during {op}): {figures}, the run's and other processes': "
                                     "no verdict; the pair is tried again")
        return ChildFailure(Status.CUDA_ERROR, f"{message} (during {op}): {figures}", self.evidence())

    def evidence(self, returncode: int | None = None) -> dict[str, Any]:
        ev: dict[str, Any] = {
            "stderr_tail": self.stderr.text(wait_s=0.5 if returncode is not None else 0.0)[-4000:],
            "stdout_tail": self.stdout.text()[-2000:],
            "stdout_bytes": self.stdout.total,
        }
        if returncode is not None:
            ev["returncode"] = returncode
        return ev

    def refused(self) -> list[str]:
        """What the operating system refused the child, as its output shows (`isolation.refusals`)."""
        if self.proc is None:
            return []
        return refusals(self.stderr.text() + "\n" + self.stdout.text())

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def close(self) -> None:
        """Ask the child to exit, then kill its whole process group regardless."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                send_command(self._cmd_w, {"op": "exit"})
                read_frame(self._res_r, time.monotonic() + 2.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for fd in (self._cmd_w, self._res_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._cmd_w = self._res_r = -1
        if self.channel is not None:
            with contextlib.suppress(Exception):
                self.channel.close()
        if self.arena is not None:
            self.arena.close()
        if self._fds is not None:
            self._fds.close()
            self._fds = None
        _LIVE.discard(self)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
