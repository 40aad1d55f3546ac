"""Memory of one forward, measured inside a child (candidate and baseline alike, by this same code),
after warm-up.

CUDA:
- `peak_bytes`: the caching allocator's peak during the forward above what was allocated before it;
- `retained_bytes`: what stays allocated after the output is freed (hidden caches, workspaces);
- `device_peak_bytes`: the device-level peak during the forward above the level before it: the
  allocator's peak plus the peak of the memory the driver handed out beside PyTorch's allocator
  during the forward (raw `cudaMalloc`, `cuMemAlloc`, VMM; freed before it returns or not), seen by
  `kbv.sandbox.devicewatch`. PyTorch's segments are left out of the driver-level part: whether the
  allocator must ask the driver depends on what its cache already holds, which differs between a
  candidate's child and a baseline's, so counting its segments would compare unlike processes;
- `device_raw_bytes`: device memory the process holds outside PyTorch's allocator (a raw workspace
  kept across calls), from the driver-level level less PyTorch's reserved memory.
CPU (Linux): resident-set peak (VmHWM, reset through /proc/self/clear_refs) above the resident set
before the call, and the resident set retained after.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kbv.verdict import MemoryStats


def measure_forward(fn: Callable[..., Any], args: Sequence[Any], device: torch.device, watch: Any = None,
                    reserved_at_start: int = 0) -> MemoryStats:
    """Memory of one call of `fn(*args)`, after one unmeasured call (lazy handles and workspaces come
    up there). `watch` is the child's running DeviceWatch (None: no driver-level figures);
    `reserved_at_start` is PyTorch's reserved memory when the watch started."""
    with torch.no_grad():
        del_out = fn(*args)
    del del_out
    if device.type == "cuda":
        return _measure_cuda(fn, args, device, watch if watch is not None and watch.running else None,
                             reserved_at_start)
    return _measure_cpu(fn, args)


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
