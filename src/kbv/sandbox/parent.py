"""Parent side of the trust boundary: start a child, talk to it, kill it.

A `Sandbox` is one spawned child process (`python -m kbv.sandbox.child`) in its own process group,
working directory and scrubbed environment. `call` sends a command and waits for the reply under a
wall-clock deadline; a child that dies, hangs or breaks the protocol surfaces as `ChildFailure` with
the status it deserves and the tail of its stderr. The child's stdout and stderr are drained by
threads and only their tails are kept.
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
from kbv.sandbox.channel import ChannelError, DeviceChannel, HostChannel, Receipt, device_channel_supported
from kbv.sandbox.wire import (
    WireClosed,
    WireTimeout,
    decode_reply,
    read_frame,
    send_command,
)
from kbv.verdict import Status

TAIL_BYTES = 16 * 1024

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
    extra_env: tuple[tuple[str, str], ...] = ()  # set by kbv for builds (`Settings.compile_env`, MAX_JOBS)


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
        "TORCH_EXTENSIONS_DIR": str(spec.build_dir / "torch_extensions"),
        "TRITON_CACHE_DIR": str(spec.build_dir / "triton"),
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
    """Make this process non-dumpable, so a child of the same (non-root) user cannot read its
    /proc/<pid>/environ or memory. Root can read them anyway: run kbv as an ordinary user."""
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
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sb.proc.pid, signal.SIGKILL)
                killed += 1
    return killed


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

    def start(self) -> None:
        """Spawn the child (it imports torch and waits); `ready` brings up its device."""
        _hide_from_children()
        self.spec.work_dir.mkdir(parents=True, exist_ok=True)
        self.spec.build_dir.mkdir(parents=True, exist_ok=True)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kbv.sandbox.child", str(cmd_r), str(res_w), str(theirs.fileno()),
                 str(os.getpid())],
                pass_fds=(cmd_r, res_w, theirs.fileno()), cwd=self.spec.work_dir, env=child_env(self.spec),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            mine.close()
            raise SandboxError(f"cannot start a sandbox child: {exc}") from exc
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

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Bring up the child's device and guards (`hello`) and pick the tensor channel. Idempotent."""
        if self.channel is None:
            self.info = self.call({"op": "hello"}, timeout_s)
            import torch

            device = torch.device(self.spec.parent_device or "cuda:0") if self.spec.device != "cpu" else None
            if device is not None and self.info.get("vmm") and device_channel_supported(device):
                assert self._fds is not None
                self.channel = DeviceChannel(self._fds, device)
            else:
                self.channel = HostChannel()
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
        deadline = time.monotonic() + timeout_s
        try:
            send_command(self._cmd_w, command)
            if paused is not None:
                deadline = self._await_reply(deadline, paused)
            reply = decode_reply(read_frame(self._res_r, deadline))
        except WireTimeout:
            self.kill()
            raise ChildFailure(Status.TIMEOUT, f"no answer within {timeout_s:.0f} s ({command['op']})",
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
        """CPU-seconds used so far by the child and by the processes it has waited for (a build's
        ninja and compilers), from /proc; None where unknown."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            return None
        return ticks / os.sysconf("SC_CLK_TCK")

    def _death(self, op: str, exc: BaseException) -> ChildFailure:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return ChildFailure(Status.CRASHED, f"the child broke the protocol during {op}: {exc}", self.evidence())
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            msg = f"killed by {name} during {op}"
        else:
            msg = f"exited with code {code} during {op}, before answering"
        return ChildFailure(Status.CRASHED, msg, self.evidence(returncode=code))

    def _candidate_error(self, err: dict[str, Any], op: str) -> ChildFailure:
        kind = err.get("kind")
        status = {"compile": Status.COMPILE_ERROR, "cuda": Status.CUDA_ERROR}.get(kind, Status.RUNTIME_ERROR)
        if kind not in ("compile", "cuda", "runtime"):
            # only the harness says "harness", and only for a command it does not know; kbv sends none
            # such, so this frame was forged: the candidate is judged, the run goes on
            self.kill()
            return ChildFailure(Status.CRASHED, f"the child answered {op} with a {kind!r} error: "
                                "the result channel was written by something other than the harness",
                                self.evidence())
        message = f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
        evidence = self.evidence()
        evidence["traceback"] = str(err.get("traceback", ""))[-8000:]
        if status is Status.CUDA_ERROR:
            self.kill()  # a child is never reused after a device error
        return ChildFailure(status, f"{message.splitlines()[0][:300] if message else kind} (during {op})", evidence)

    def evidence(self, returncode: int | None = None) -> dict[str, Any]:
        ev: dict[str, Any] = {
            "stderr_tail": self.stderr.text(wait_s=0.5 if returncode is not None else 0.0)[-4000:],
            "stdout_tail": self.stdout.text()[-2000:],
            "stdout_bytes": self.stdout.total,
        }
        if returncode is not None:
            ev["returncode"] = returncode
        return ev

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
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
        if self._fds is not None:
            self._fds.close()
            self._fds = None
        _LIVE.discard(self)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
