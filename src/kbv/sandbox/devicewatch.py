"""Device allocations and kernel launches of this process, seen at the driver (CUPTI callbacks).

PyTorch's allocator statistics see only PyTorch's allocator; NVML's per-process figure sees only what
is held when it is read, context and modules included, so it compares unlike processes. A workspace
taken with raw `cudaMalloc` (or `cuMemAlloc`, `cuMemCreate`, `cudaMallocAsync`) is invisible to the
first, and one freed before a call returns to both. CUPTI's driver-API callbacks see every
allocation and free the driver makes for this process, whoever asks, and every kernel launch.

The child starts the watch before any candidate code runs and reads it at marks: the level of
device memory allocated (`level_bytes`), the launches so far, and the highest level since a mark
(`peak_since`). It stops the watch before anything is profiled or timed: CUPTI allows one subscriber
per process (PyTorch's Kineto profiler needs it), and a callback per driver call must not slow timed calls.
Where CUPTI is missing or refuses, `bind`/`start` say so and the figures are absent, never guessed.
This runs inside the child, beside candidate code that could tamper with it: its figures are evidence.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass
from typing import Any

DOMAIN_DRIVER = 1  # CUPTI_CB_DOMAIN_DRIVER_API
SITE_ENTER, SITE_EXIT = 0, 1


class _CallbackData(ctypes.Structure):
    """CUpti_CallbackData."""

    _fields_ = [("site", ctypes.c_int), ("functionName", ctypes.c_char_p), ("functionParams", ctypes.c_void_p),
                ("functionReturnValue", ctypes.c_void_p), ("symbolName", ctypes.c_char_p),
                ("context", ctypes.c_void_p), ("contextUid", ctypes.c_uint32),
                ("correlationData", ctypes.c_void_p), ("correlationId", ctypes.c_uint32)]


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
_ALLOCS = {"cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocManaged", "cuMemAllocFromPoolAsync"}
_FREES = {"cuMemFree_v2", "cuMemFreeAsync"}


@dataclass(frozen=True)
class Mark:
    """The watch's counters at one moment."""

    level_bytes: int
    launches: int


def raw_peak(events: list[tuple[int, int]], allocator_segments: set[int]) -> int:
    """The highest level, over `events` (a `recorded()` list), of the allocations that are none of
    `allocator_segments` (PyTorch's segments, by address)."""
    level = peak = 0
    live: dict[int, int] = {}
    for key, nbytes in events:
        if nbytes > 0:
            if key not in allocator_segments:
                live[key] = nbytes
                level += nbytes
                peak = max(peak, level)
        elif key in live:
            level -= live.pop(key)
    return peak


def find_cupti() -> str | None:
    """libcupti next to this process's CUDA libraries (the wheels torch depends on), or the system's."""
    import torch

    roots = [os.path.join(os.path.dirname(torch.__file__), "lib"),
             os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "**", "libcupti.so*"), recursive=True))
        if hits:
            return hits[0]
    import ctypes.util

    return ctypes.util.find_library("cupti")


class DeviceWatch:
    """CUPTI, bound and started once per child before any candidate code runs."""

    def __init__(self, cupti: ctypes.CDLL, driver: ctypes.CDLL) -> None:
        self._cupti = cupti
        self._range = driver.cuMemGetAddressRange_v2
        self._range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        self._range.restype = ctypes.c_int
        self._callback = _CALLBACK(self._on_call)  # kept alive as long as the watch
        self._sub: ctypes.c_void_p | None = None
        self._live: dict[int, int] = {}  # pointer or VMM handle -> bytes, allocated while watched
        self.level_bytes = 0  # allocated minus freed since the start (frees of older memory sized by the driver)
        self.launches = 0
        self._peak = 0
        self._events: list[tuple[int, int]] | None = None  # (pointer or handle, +/- bytes) while recording
        self.problem: str | None = None  # why the watch is not running

    @classmethod
    def bind(cls) -> DeviceWatch | None:
        path = find_cupti()
        if path is None:
            return None
        try:
            return cls(ctypes.CDLL(path), ctypes.CDLL("libcuda.so.1"))
        except (OSError, AttributeError):
            return None

    @property
    def running(self) -> bool:
        return self._sub is not None

    def start(self) -> bool:
        sub = ctypes.c_void_p()
        result = self._cupti.cuptiSubscribe(ctypes.byref(sub), self._callback, None)
        if result != 0:
            self.problem = f"cuptiSubscribe returned {result} (another subscriber holds CUPTI)"
            return False
        if self._cupti.cuptiEnableDomain(1, sub, DOMAIN_DRIVER) != 0:
            self._cupti.cuptiUnsubscribe(sub)
            self.problem = "cuptiEnableDomain refused the driver domain"
            return False
        self._sub = sub
        return True

    def stop(self, why: str) -> None:
        if self._sub is not None:
            self._cupti.cuptiUnsubscribe(self._sub)
            self._sub = None
            self.problem = f"stopped before {why}"

    def mark(self, record: bool = False) -> Mark:
        """The counters now; the peak starts again from the current level. With `record`, every
        allocation and free from now on is kept for `raw_peak_since` (until `mark` again)."""
        self._peak = self.level_bytes
        self._events = [] if record else None
        return Mark(self.level_bytes, self.launches)

    def peak_since(self, mark: Mark) -> int:
        """The highest level since `mark` (made by `mark()`), above the level at it."""
        return max(self._peak - mark.level_bytes, 0)

    def raw_peak_since(self, allocator_segments: set[int]) -> int:
        """The highest level, since a recording `mark`, of the allocations that are none of
        `allocator_segments` (PyTorch's segments, by address): raw `cudaMalloc`/`cuMemAlloc`/VMM
        memory, whether freed before now or not. PyTorch's own memory is left out, so that its
        cache (which differs between processes) does not count for or against anyone."""
        return raw_peak(self.recorded(), allocator_segments)

    def recorded(self) -> list[tuple[int, int]]:
        """The allocations and frees since a recording `mark`, as (pointer or handle, +/- bytes): kept
        for `raw_peak` once the segments PyTorch made meanwhile can be listed."""
        return list(self._events or ())

    def _grow(self, key: int, nbytes: int) -> None:
        self._live[key] = nbytes
        self.level_bytes += nbytes
        self._peak = max(self._peak, self.level_bytes)
        if self._events is not None:
            self._events.append((key, nbytes))

    def _shrink(self, key: int, nbytes: int) -> None:
        self.level_bytes -= nbytes
        if self._events is not None:
            self._events.append((key, -nbytes))

    def _on_call(self, user: Any, domain: int, cbid: int, data: Any) -> None:
        try:
            d = ctypes.cast(data, ctypes.POINTER(_CallbackData)).contents
            name = (d.functionName or b"").decode()
            if d.site == SITE_ENTER:
                if name.startswith("cuLaunch"):
                    self.launches += 1
                elif name in _FREES:
                    self._freed(ctypes.cast(d.functionParams, ctypes.POINTER(ctypes.c_uint64)).contents.value)
                elif name == "cuMemRelease":
                    handle = ctypes.cast(d.functionParams, ctypes.POINTER(ctypes.c_uint64)).contents.value
                    self._shrink(handle, self._live.pop(handle, 0))
                return
            if not d.functionReturnValue or ctypes.cast(d.functionReturnValue, ctypes.POINTER(ctypes.c_int)).contents.value:
                return  # the call failed: nothing was allocated
            if name in _ALLOCS or name == "cuMemCreate":
                params = ctypes.cast(d.functionParams, ctypes.POINTER(ctypes.c_void_p * 2)).contents
                key = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value
                self._grow(key, int(params[1] or 0))
            elif name == "cuMemAllocPitch_v2":
                params = ctypes.cast(d.functionParams, ctypes.POINTER(ctypes.c_void_p * 4)).contents
                key = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value
                pitch = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_size_t)).contents.value
                self._grow(key, int(pitch) * int(params[3] or 0))
        except Exception:  # a callback must never break the call it watches
            pass

    def _freed(self, ptr: int) -> None:
        if ptr in self._live:
            self._shrink(ptr, self._live.pop(ptr))
            return
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if ptr and self._range(ctypes.byref(base), ctypes.byref(size), ptr) == 0 and base.value == ptr:
            self._shrink(ptr, int(size.value))  # allocated before the watch: its free lowers the level
