"""Memory of one forward, measured inside a child (candidate and baseline alike), after warm-up.

CUDA:
- `peak_bytes`: the caching allocator's peak during the forward above what was allocated before it;
- `retained_bytes`: what stays allocated after the output is freed (hidden caches, workspaces);
- `device_bytes`: device memory in use by the process with the output alive (free memory from the
  driver, after emptying the allocator's cache) minus the same before the model was built: this sees
  raw `cudaMalloc` that the allocator never saw, and the extension's own footprint.
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


def device_in_use(device: torch.device) -> int | None:
    """Device memory this process holds (NVML, per process), after emptying the allocator's cache.
    Falls back to the whole device's use where NVML cannot list processes. None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    mine = _nvml_process_bytes(device)
    if mine is not None:
        return mine
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def _nvml_process_bytes(device: torch.device) -> int | None:
    with contextlib.suppress(Exception):
        import os

        import pynvml

        pynvml.nvmlInit()
        try:
            handle = _nvml_handle(pynvml, device)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    return None


def _nvml_handle(pynvml: Any, device: torch.device) -> Any:
    """The NVML handle of `device`, matched by PCI bus id (CUDA and NVML number devices differently)."""
    bus = getattr(torch.cuda.get_device_properties(device), "pci_bus_id", None)
    count = pynvml.nvmlDeviceGetCount()
    for i in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if bus is None or count == 1:
            return handle
        info = pynvml.nvmlDeviceGetPciInfo(handle)
        if int(info.bus) == int(bus):
            return handle
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def measure_forward(fn: Callable[..., Any], args: Sequence[Any], device: torch.device,
                    device_floor: int | None) -> MemoryStats:
    """Memory of one call of `fn(*args)`; `device_floor` is `device_in_use` before the model existed."""
    if device.type == "cuda":
        return _measure_cuda(fn, args, device, device_floor)
    return _measure_cpu(fn, args)


def _measure_cuda(fn: Callable[..., Any], args: Sequence[Any], device: torch.device,
                  device_floor: int | None) -> MemoryStats:
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        out = fn(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    in_use = device_in_use(device)
    del out
    gc.collect()
    torch.cuda.synchronize(device)
    retained = torch.cuda.memory_allocated(device) - base
    device_bytes = None if in_use is None or device_floor is None else max(in_use - device_floor, 0)
    return MemoryStats(peak_bytes=int(peak), retained_bytes=int(retained), device_bytes=device_bytes)


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


def raises_memory(candidate: MemoryStats, baseline: MemoryStats, ratio: float = 1.1,
                  slack_bytes: int = 1 << 20) -> bool:
    """Whether the candidate's peak exceeds the baseline's by more than 10% and 1 MiB."""
    if candidate.peak_bytes < 0 or baseline.peak_bytes < 0:
        return False
    return candidate.peak_bytes > baseline.peak_bytes * ratio and \
        candidate.peak_bytes - baseline.peak_bytes > slack_bytes
