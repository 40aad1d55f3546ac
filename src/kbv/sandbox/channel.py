"""How tensors cross the trust boundary, parent side. One channel per child, chosen at its hello.

Both kinds keep the same promises (ARCHITECTURE §4):
- the child never writes memory the verdict is read from: what it returns is copied into the
  parent's own, private tensors the moment the reply arrives, and judged there;
- the child sees inputs only when a command hands them over, never a seed;
- a child that dies, hangs or keeps a handle cannot reach the parent's memory afterwards.

`DeviceChannel` (CUDA, `kbv.sandbox.vmm`): nothing goes through host memory. For inputs, the child
allocates exportable device memory (`alloc`), the parent maps it, copies device-to-device while the
child waits for its next command, and unmaps; the child clones what it was given into ordinary
tensors and frees the export. For outputs, the child copies them into a fresh export and passes its
descriptor with the reply; the parent maps it, clones, unmaps. The parent holds its own handle of
every allocation it maps, so a child killed in the middle of a copy cannot pull the memory away.
The parent never exports its own memory.

`HostChannel` (CPU, or a GPU whose driver lacks VMM): shared-memory files owned by the parent
(`kbv.sandbox.wire.SharedArena`, one directory per child, the only one of them its sandbox shows):
the parent writes copies of inputs, the child maps them copy-on-write; outputs are written by the
child into parent-allocated files, which the parent clones on arrival and unlinks.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import kbv.sandbox.vmm as vmm
from kbv.sandbox.wire import SharedArena, TensorHandle, dtype_name
from kbv.stages import stage


class ChannelError(Exception):
    """The child's side of a transfer is malformed (a forged or broken reply)."""


@dataclass(frozen=True)
class SlotRef:
    """One tensor of an `alloc` the child made: the child resolves it to a clone of what was copied in."""

    slot: int
    index: int


@dataclass
class Receipt:
    """What `expect` prepared for a command's outputs, redeemed by `take` once the reply is in."""

    like: list[torch.Tensor]
    buffers: list[tuple[torch.Tensor, TensorHandle]]


class HostChannel:
    kind = "host"

    def __init__(self, arena: SharedArena) -> None:
        self.arena = arena  # the child's own (`kbv.sandbox.parent.Sandbox.arena`), bound into its sandbox
        self._sent: list[Any] = []  # the last put's files: the child has mapped them by the next put

    def put(self, sb: Any, values: Sequence[Any], timeout_s: float) -> list[Any]:
        """`values` as a command carries them: tensors replaced by handles of shared copies."""
        with stage("boundary"):
            self.arena.discard(self._sent)
            self._sent = self.arena.handles(values)
            return list(self._sent)

    def expect(self, like: Sequence[torch.Tensor]) -> tuple[dict[str, Any], Receipt]:
        """Command fields asking for outputs shaped like `like`, and the receipt to redeem."""
        with stage("boundary"):
            buffers = [self.arena.empty(t.shape, t.dtype) for t in like]
        return {"outputs": [h for _, h in buffers]}, Receipt(list(like), buffers)

    def take(self, sb: Any, reply: dict[str, Any], receipt: Receipt, timeout_s: float) -> list[torch.Tensor] | None:
        """Private copies of the outputs the child wrote (None when it could not write them all)."""
        with stage("boundary"):
            try:
                if not reply.get("copied"):
                    return None
                return [buf.to(_home(t, buf.device), copy=True) for (buf, _), t in zip(receipt.buffers, receipt.like)]
            finally:
                self.arena.discard([h for _, h in receipt.buffers])

    def close(self) -> None:
        self.arena.close()


class DeviceChannel:
    kind = "device"

    def __init__(self, sock: socket.socket, device: torch.device) -> None:
        self.sock = sock
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()

    def put(self, sb: Any, values: Sequence[Any], timeout_s: float) -> list[Any]:
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if not tensors:
            return list(values)
        specs = [[list(t.shape), dtype_name(t.dtype)] for t in tensors]
        reply = sb.call({"op": "alloc", "specs": specs}, timeout_s)  # no room: `Sandbox._no_room` says whose fault
        with stage("boundary"):
            views = self._open(reply, tensors, timeout_s)
            try:
                for view, t in views:
                    view.copy_(t.detach())
            finally:
                self._release_after_sync()
        refs, k = [], 0
        for v in values:
            if isinstance(v, torch.Tensor):
                refs.append(SlotRef(int(reply["slot"]), k))
                k += 1
            else:
                refs.append(v)
        return refs

    def expect(self, like: Sequence[torch.Tensor]) -> tuple[dict[str, Any], Receipt]:
        return {"export": [[list(t.shape), dtype_name(t.dtype)] for t in like]}, Receipt(list(like), [])

    def take(self, sb: Any, reply: dict[str, Any], receipt: Receipt, timeout_s: float) -> list[torch.Tensor] | None:
        export = reply.get("export")
        if not reply.get("copied") or not isinstance(export, dict):
            return None
        with stage("boundary"):
            views = self._open(export, receipt.like, timeout_s)
            try:
                outs = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in receipt.like]
                for out, (view, _) in zip(outs, views):
                    out.copy_(view)
            finally:
                self._release_after_sync()
        return [o if _home(t, self.device) == self.device else o.to(t.device) for o, t in zip(outs, receipt.like)]

    def _open(self, layout: dict[str, Any], like: Sequence[torch.Tensor], timeout_s: float
              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Map the child's export described by `layout` ({size, offsets}) and view it as `like`."""
        size, offsets = layout.get("size"), layout.get("offsets")
        if not isinstance(size, int) or not isinstance(offsets, list) or len(offsets) != len(like):
            raise ChannelError(f"malformed export layout {str(layout)[:120]}")
        for off, t in zip(offsets, like):
            if not isinstance(off, int) or off < 0 or off + t.numel() * t.element_size() > size:
                raise ChannelError("an export offset lies outside its allocation")
        try:
            fd = vmm.recv_fd(self.sock, min(timeout_s, 30.0))
            self._mapping = vmm.open_fd(fd, size, self.index)
        except (OSError, vmm.VmmError) as exc:
            raise ChannelError(f"the child's device memory could not be mapped: {exc}") from exc
        base = self._mapping.ptr
        return [(vmm.as_tensor(base + off, tuple(t.shape), t.dtype, self.index), t) for off, t in zip(offsets, like)]

    def _release_after_sync(self) -> None:
        """Unmap once every copy queued on the mapping is done (also when one of them raised): an
        unmap under a running copy would fault the parent's own context."""
        try:
            torch.cuda.synchronize(self.device)
        finally:
            self._release()

    def _release(self) -> None:
        mapping = getattr(self, "_mapping", None)
        if mapping is not None:
            self._mapping = None
            mapping.release()

    def close(self) -> None:
        self._release()


def _home(like: torch.Tensor, default: torch.device) -> torch.device:
    """Where an output shaped like `like` goes: `like`'s device, or `default` for a meta tensor."""
    return default if like.device.type == "meta" else like.device


def device_channel_supported(device: torch.device) -> bool:
    """Whether this process can import VMM exports on `device` (probed once per device)."""
    if device.type != "cuda":
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SUPPORTED:
        try:
            torch.zeros(1, device=device)
            vmm.granularity(key)
            _SUPPORTED[key] = True
        except (vmm.VmmError, RuntimeError):
            _SUPPORTED[key] = False
    return _SUPPORTED[key]


_SUPPORTED: dict[int, bool] = {}
