"""The wire between parent and child: frames, and tensors shared without copying through a pipe.

Frames are an 8-byte big-endian length and a payload. Commands (parent -> child) are pickled: the
child trusts its parent. Replies (child -> parent) are JSON only: the parent never unpickles what
untrusted code could have written.

`SharedArena` is the host side of tensor transfer (see `kbv.sandbox.channel`): files in a private
directory under /dev/shm, owned by the parent, mapped by both processes. On a GPU, tensors cross
device-to-device instead (`kbv.sandbox.vmm`), and the arena is only the fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import struct
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_HEADER = struct.Struct(">Q")
MAX_REPLY_BYTES = 64 << 20


class WireClosed(Exception):
    """The other end closed its pipe."""


class WireTimeout(Exception):
    """No complete frame before the deadline."""


def write_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_REPLY_BYTES) -> bytes:
    """Read one frame; raise WireClosed on EOF, WireTimeout past `deadline` (time.monotonic)."""
    header = _read_exact(fd, _HEADER.size, deadline)
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise WireClosed(f"frame of {size} bytes exceeds the {limit}-byte limit")
    return _read_exact(fd, size, deadline)


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WireTimeout()
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
        chunk = os.read(fd, min(size - len(chunks), 1 << 20))
        if not chunk:
            raise WireClosed("pipe closed")
        chunks += chunk
    return bytes(chunks)


def send_command(fd: int, command: dict[str, Any]) -> None:
    write_frame(fd, pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL))


def send_reply(fd: int, reply: dict[str, Any]) -> None:
    write_frame(fd, json.dumps(reply, default=_json_default).encode())


def decode_reply(payload: bytes) -> dict[str, Any]:
    reply = json.loads(payload.decode("utf-8", errors="replace"))
    if not isinstance(reply, dict):
        raise WireClosed("reply is not an object")
    return reply


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float):
        return repr(obj)
    return str(obj)


@dataclass(frozen=True)
class TensorHandle:
    """What the child needs to map one parent-owned tensor."""

    dtype: str  # "float32", ...
    shape: tuple[int, ...]
    path: str  # the shared file
    writable: bool = False  # an output buffer; inputs are mapped copy-on-write (the child's writes stay its own)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name}")
    return dtype


class SharedArena:
    """Parent side: allocates host tensors the child can map, and removes them all at once.

    Its files live in a directory of their own (one per child: a sandboxed child sees its arena and
    no other). `owner` (uid, gid): the child's identity when it is not kbv's: the directory can be
    searched but not listed, inputs can be read, and output buffers are given to it to write."""

    def __init__(self, owner: tuple[int, int] | None = None) -> None:
        self._files: list[Path] = []
        self.owner = owner
        base = _shm_base()
        _remove_orphans(Path(base or tempfile.gettempdir()))
        self.dir = Path(tempfile.mkdtemp(prefix=f"kbv-shm-{os.getpid()}-", dir=base))
        if owner is not None:
            os.chmod(self.dir, 0o711)

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, TensorHandle]:
        """A contiguous shareable tensor (uninitialised) and its handle: an output buffer the child writes."""
        return self._empty_shm(tuple(int(s) for s in shape), dtype, writable=True)

    def share(self, tensor: torch.Tensor) -> tuple[torch.Tensor, TensorHandle]:
        """A shareable copy of `tensor` (same values, contiguous) and its handle: the child reads it."""
        copy, handle = self._empty_shm(tuple(int(s) for s in tensor.shape), tensor.dtype, writable=False)
        copy.copy_(tensor.detach())
        return copy, handle

    def handles(self, values: Sequence[Any]) -> list[Any]:
        """`values` as a command carries them: each tensor replaced by the handle of a shared copy,
        anything else as it is."""
        return [self.share(v)[1] if isinstance(v, torch.Tensor) else v for v in values]

    def discard(self, handles: Sequence[Any]) -> None:
        """Remove the files of `handles` now (a child that mapped them keeps its mapping)."""
        for h in handles:
            if isinstance(h, TensorHandle):
                path = Path(h.path)
                with contextlib.suppress(OSError):
                    path.unlink()
                with contextlib.suppress(ValueError):
                    self._files.remove(path)

    def _empty_shm(self, shape: tuple[int, ...], dtype: torch.dtype, writable: bool
                   ) -> tuple[torch.Tensor, TensorHandle]:
        numel = 1
        for s in shape:
            numel *= s
        nbytes = max(numel * torch.empty((), dtype=dtype).element_size(), 1)
        path = self.dir / uuid.uuid4().hex
        raw = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        self._files.append(path)
        if self.owner is not None:  # created 0600, kbv's: the child gets what it needs and no more
            if writable:
                os.chown(path, *self.owner)
            else:
                os.chmod(path, 0o644)
        tensor = raw.view(dtype).view(shape) if numel else torch.empty(shape, dtype=dtype)
        handle = TensorHandle(dtype_name(dtype), shape, str(path), writable)
        return tensor, handle

    def close(self) -> None:
        """Remove the files (a child may still hold mappings: that is fine)."""
        import shutil

        for path in self._files:
            with contextlib.suppress(OSError):
                path.unlink()
        self._files.clear()
        shutil.rmtree(self.dir, ignore_errors=True)  # with whatever a child left in it

    def __enter__(self) -> SharedArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove_orphans(base: Path) -> None:
    """Remove arenas left by kbv processes that no longer exist (a run killed with SIGKILL)."""
    import shutil

    for d in base.glob("kbv-shm-*-*"):
        try:
            pid = int(d.name.split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


def _shm_base(min_free_bytes: int = 4 << 30) -> str | None:
    """/dev/shm when it has room (containers often cap it at 64 MiB), else the temp directory."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    if not os.access("/dev/shm", os.W_OK) or st.f_bavail * st.f_frsize < min_free_bytes:
        return None
    return "/dev/shm"


def map_tensor(handle: TensorHandle) -> torch.Tensor:
    """Child side: the parent's tensor, mapped into this process: an output buffer shared, an input
    copy-on-write (opened read-only: what the child writes into it stays in its own memory)."""
    dtype = dtype_from_name(handle.dtype)
    numel = 1
    for s in handle.shape:
        numel *= s
    if numel == 0:
        return torch.empty(handle.shape, dtype=dtype)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_file(handle.path, shared=bool(handle.writable), size=nbytes, dtype=torch.uint8)
    return raw.view(dtype).view(handle.shape)
