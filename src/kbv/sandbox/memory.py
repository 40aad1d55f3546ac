"""Memory of the model's forward, measured inside a child (candidate and baseline alike, by this same
code), counted from before the model's first call.

A workspace a model makes on its first call and keeps is its footprint, as much as one it makes on
every call. So `FirstCall` is taken once per child, at the start of the first command that calls the
model: the level of memory then, and the harness's own part of it (its inputs, timing pool, kept
inputs, L2 flush buffer). Where that command is `forward` (the verified protocol's first correctness
run) or `memory` itself (a baseline child), the first call's own peak is taken too, around the call
alone. `measure_forward` then measures one forward after a warm-up call, and reports the larger of
the two calls' figures (`with_first_call`):

CUDA:
- `peak_bytes`: the caching allocator's peak during a call above what was allocated just before it,
  the larger of the first call's and the measured one's, and never less than `retained_bytes`. The
  first call's leaves out the libraries' workspaces it made (cuBLAS's, kept per stream for good:
  a baseline child makes the same once, and PyTorch's own leak check lets them go the same way);
- `retained_bytes`: what stays allocated once the output is freed, above the level before the first
  call, less what the harness allocated meanwhile (by the allocator's own block sizes) and less the
  libraries' workspaces (let go before both readings): hidden caches, workspaces kept on the model
  or in a global, whichever call made them;
- `device_peak_bytes`: the device-level peak during a call above the level before it, the larger of
  the two calls': the allocator's peak plus the peak of the memory the driver handed out beside
  PyTorch's allocator during the call (raw `cudaMalloc`, `cuMemAlloc`, VMM; freed before it returns
  or not), seen by `kbv.sandbox.devicewatch`. PyTorch's segments are left out of the driver-level
  part: whether the allocator must ask the driver depends on what its cache already holds, which
  differs between a candidate's child and a baseline's, so counting its segments would compare unlike
  processes;
- `device_raw_bytes`: device memory the process holds outside PyTorch's allocator (a raw workspace
  kept across calls), from the driver-level level less PyTorch's reserved memory.
CPU (Linux): the measured call's resident-set peak (VmHWM, reset through /proc/self/clear_refs) above
the resident set before it; the first call's own is not taken, since its resident set mixes in the
libraries' one-time start-up (thread pools, BLAS buffers). Retained: the larger of the resident set
the measured call kept and the bytes of the tensor storages alive in the process (found through the
garbage collector, whether touched or not) above their level before the first call, less the
harness's; the peak is never less than that.
The figures are read inside the candidate's process: evidence it could tamper with, not proof.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from kbv.verdict import MemoryStats

_HARNESS_DEPTH = 4  # lists of lists of tensors (the pool), dicts of views (slots)


@dataclass(frozen=True)
class Levels:
    """Memory at one moment, in bytes: all of it as this module counts it (the allocator's allocated
    bytes on CUDA; the bytes of the tensor storages alive in the process on CPU), the harness's own
    part of that, and the libraries' workspaces let go just before it was read (cuBLAS's)."""

    total_bytes: int
    harness_bytes: int
    library_bytes: int = 0


@dataclass(frozen=True)
class FirstCallFigures:
    """What a child found about the model's first call, in bytes."""

    held_bytes: int  # held now above the level before the first call, less the harness's growth
    peak_bytes: int | None  # the first call's allocator peak above the level just before it; None: not taken
    raw_peak_bytes: int | None  # the driver-level peak outside PyTorch's allocator during it; None: no watch
    library_bytes: int  # the libraries' workspaces made since the first call began (in its peak, not the model's)


def held_since(before: Levels, after: Levels) -> int:
    """What is held at `after` beyond `before`, less what the harness itself holds beyond what it held
    then; never negative."""
    grown = after.total_bytes - before.total_bytes
    return max(grown - (after.harness_bytes - before.harness_bytes), 0)


def with_first_call(steady: MemoryStats, first: FirstCallFigures) -> MemoryStats:
    """The measured call's figures `steady`, counted from before the model's first call: retained is
    the larger of what the measured call kept and what is held since the first call, and each peak is
    the measured call's above that level (what is held since the first call, plus the measured call's
    own peak above it). What the first call allocated and freed again (`first.peak_bytes`,
    kept as evidence) is not a peak of the kernel's: one-time work such as Triton's autotuner, which
    benchmarks its configurations over a 256 MB cache-clearing buffer on the first call, would make
    every autotuned kernel "raise peak memory" on a small problem. Figures not measured (-1) stay so."""
    if steady.peak_bytes < 0 or steady.retained_bytes < 0:
        return steady
    retained = max(steady.retained_bytes, first.held_bytes)
    peak = max(steady.peak_bytes + first.held_bytes, retained)
    device_peak = steady.device_peak_bytes
    if device_peak is not None:
        device_peak = max(device_peak + first.held_bytes, peak)
    return replace(steady, peak_bytes=peak, retained_bytes=retained, device_peak_bytes=device_peak)


class FirstCall:
    """The memory before the model's first call, taken once per child when the first command that
    calls the model begins (`op`), and, where that command lets it be taken around the call alone,
    the first call's peak (`window`). `harness()` gives the harness's own objects holding tensors as
    they are at the moment it is called (kept inputs, the pool, the flush buffer, the slots)."""

    def __init__(self, op: str, device: torch.device, harness: Callable[[], list[Any]]) -> None:
        self.op = op
        self.device = device
        self.harness = harness
        self.before = read_levels(device, harness())
        self.peak_bytes: int | None = None
        self.raw_peak_bytes: int | None = None
        self._events: list[tuple[int, int]] | None = None
        self._taken = False

    @contextlib.contextmanager
    def window(self, op: str, watch: Any = None) -> Iterator[None]:
        """Around the model's first call, in the command `op` that makes it (later calls: nothing):
        the allocator's peak above the level just before, and the driver's allocations meanwhile
        (`watch`, running or None). Host-side reads only: nothing is synchronised or delayed between
        the call's return and the harness's next check (work still running on another stream)."""
        if self._taken or op != self.op or self.device.type != "cuda":
            yield
            return
        self._taken = True
        level = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        recording = watch is not None and watch.running
        if recording:
            watch.mark(record=True)
        try:
            yield
        finally:
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device) - level)
            if recording:
                self._events = watch.recorded()
                watch.mark()  # recording ends

    def settle(self) -> None:
        """The first call's driver-level peak, once the segments PyTorch made during it can be told
        from raw allocations: before anything releases PyTorch's cache (`_measure_cuda` does)."""
        if self._events is not None and self.raw_peak_bytes is None:
            from kbv.sandbox.devicewatch import raw_peak

            self.raw_peak_bytes = raw_peak(self._events, _segments(self.device))

    def figures(self) -> FirstCallFigures:
        """The figures now (after the measured call, its output freed)."""
        after = read_levels(self.device, self.harness())
        return FirstCallFigures(held_bytes=held_since(self.before, after), peak_bytes=self.peak_bytes,
                                raw_peak_bytes=self.raw_peak_bytes, library_bytes=after.library_bytes)


def first_call_window(first: FirstCall | None, op: str,
                      watch: Any = None) -> contextlib.AbstractContextManager[None]:
    """`first.window(op, watch)`, or nothing where no first call is being followed."""
    return contextlib.nullcontext() if first is None else first.window(op, watch)


def read_levels(device: torch.device, harness: list[Any]) -> Levels:
    """The levels now (`Levels`), after a garbage collection. On CUDA the libraries' workspaces are
    let go first, as PyTorch's own leak check does: a library makes them again when it next needs
    them, and they hold nothing of the model's."""
    gc.collect()
    if device.type == "cuda":
        with_workspaces = torch.cuda.memory_allocated(device)
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        total = torch.cuda.memory_allocated(device)
        blocks = _allocator_blocks(device)
        harness_bytes = sum(blocks.get(ptr, 0) for ptr in _harness_storages(harness, device))
        return Levels(int(total), int(harness_bytes), int(with_workspaces - total))
    alive = _live_storages(device)
    return Levels(sum(alive.values()), sum(_harness_storages(harness, device).values()))


def _harness_storages(objs: list[Any], device: torch.device) -> dict[int, int]:
    """{storage address: bytes} of the tensors on `device` in `objs` (lists, tuples, dicts, nested)."""
    found: dict[int, int] = {}
    stack = [(obj, 0) for obj in objs]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, torch.Tensor):
            _add_storage(found, obj, device)
        elif depth < _HARNESS_DEPTH and isinstance(obj, (list, tuple)):
            stack.extend((o, depth + 1) for o in obj)
        elif depth < _HARNESS_DEPTH and isinstance(obj, dict):
            stack.extend((o, depth + 1) for o in obj.values())
    return found


def _live_storages(device: torch.device) -> dict[int, int]:
    """{storage address: bytes} of every tensor on `device` the garbage collector tracks (every tensor
    a Python object holds), a view counting its whole storage, each storage once."""
    found: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # type(): no object's __class__ property is run
            _add_storage(found, obj, device)
    return found


def _add_storage(found: dict[int, int], t: torch.Tensor, device: torch.device) -> None:
    try:
        if t.device.type != device.type or (device.index is not None and t.device.index != device.index):
            return
        storage = t.untyped_storage()
        if storage.data_ptr():
            found[storage.data_ptr()] = int(storage.nbytes())
    except Exception:  # sparse, meta or wrapper tensors hold no storage of their own
        pass


def _allocator_blocks(device: torch.device) -> dict[int, int]:
    """{address: bytes} of the caching allocator's allocated blocks on `device`, as it counts them (a
    request rounded up, a block not worth splitting whole)."""
    blocks: dict[int, int] = {}
    for seg in _device_segments(device):
        address = int(seg["address"])
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                blocks[address] = int(block["size"])
            address += int(block["size"])
    return blocks


def _segments(device: torch.device) -> set[int]:
    """The addresses of PyTorch's segments on `device` (each one driver allocation)."""
    return {int(seg["address"]) for seg in _device_segments(device)}


def _device_segments(device: torch.device) -> list[dict[str, Any]]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return [seg for seg in torch.cuda.memory_snapshot() if seg.get("device", index) == index]


def measure_forward(fn: Callable[..., Any], args: Sequence[Any], device: torch.device, watch: Any = None,
                    reserved_at_start: int = 0, first: FirstCall | None = None) -> MemoryStats:
    """Memory of one call of `fn(*args)`, after one unmeasured call (lazy handles and workspaces come
    up there), counted from before the model's first call when `first` followed it (see the module's
    docstring); the unmeasured call is the first call where no command called the model before.
    `watch` is the child's running DeviceWatch (None: no driver-level figures); `reserved_at_start`
    is PyTorch's reserved memory when the watch started."""
    running = watch if watch is not None and watch.running else None
    with torch.no_grad(), first_call_window(first, "memory", running):
        del_out = fn(*args)
    del del_out
    if first is not None and device.type == "cuda":
        first.settle()
    if device.type == "cuda":
        steady = _measure_cuda(fn, args, device, running, reserved_at_start)
    else:
        steady = _measure_cpu(fn, args)
    return steady if first is None else with_first_call(steady, first.figures())


def _measure_cuda(fn: Callable[..., Any], args: Sequence[Any], device: torch.device, watch: Any,
                  reserved_at_start: int) -> MemoryStats:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # a segment PyTorch needs for the forward is taken inside the window, and is its own afterwards
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    if watch is not None:
        watch.mark(record=True)
    with torch.no_grad():
        out = fn(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    device_peak = None
    if watch is not None:
        segments = {int(seg["address"]) for seg in torch.cuda.memory_snapshot()}
        device_peak = int(peak) + watch.raw_peak_since(segments)
        watch.mark()  # recording ends
    del out
    gc.collect()
    torch.cuda.synchronize(device)
    retained = torch.cuda.memory_allocated(device) - base
    torch.cuda.empty_cache()
    raw = None
    if watch is not None:  # driver-level memory held that PyTorch's allocator does not account for
        raw = max(watch.level_bytes - (torch.cuda.memory_reserved(device) - reserved_at_start), 0)
    return MemoryStats(peak_bytes=int(peak), retained_bytes=int(retained), device_peak_bytes=device_peak,
                       device_raw_bytes=raw)


def _measure_cpu(fn: Callable[..., Any], args: Sequence[Any]) -> MemoryStats:
    gc.collect()
    before = _status_kib("VmRSS")
    _reset_peak_rss()
    with torch.no_grad():
        out = fn(*args)
    peak = _status_kib("VmHWM")
    del out
    gc.collect()
    after = _status_kib("VmRSS")
    if before is None or peak is None or after is None:
        return MemoryStats(peak_bytes=-1, retained_bytes=-1)
    return MemoryStats(peak_bytes=max(peak - before, 0) * 1024, retained_bytes=max(after - before, 0) * 1024)


def _status_kib(field: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    return None


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
