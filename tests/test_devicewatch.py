"""The driver-level watch's bookkeeping (kbv.sandbox.devicewatch), fed scripted CUPTI callback records:
allocations and frees by any route, the level, the peak since a mark, launches. (On a GPU the real
CUPTI drives it: tests/test_timing_gpu.py.)"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from kbv.sandbox.devicewatch import SITE_ENTER, SITE_EXIT, DeviceWatch, _CallbackData

MIB = 1 << 20


class _Driver:
    """cuMemGetAddressRange_v2 over a table of allocations made before the watch started."""

    def __init__(self, older: dict[int, int]) -> None:
        self.older = older

        def address_range(base, size, ptr):
            if ptr not in self.older:
                return 1  # CUDA_ERROR_INVALID_VALUE
            base._obj.value, size._obj.value = ptr, self.older[ptr]
            return 0

        self.cuMemGetAddressRange_v2 = address_range


class _Script:
    """Feeds one callback record at a time, keeping its structures alive while the watch reads them."""

    def __init__(self, watch: DeviceWatch) -> None:
        self.watch = watch

    def call(self, name: str, site: int, params: ctypes.Structure | None = None, result: int = 0) -> None:
        ret = ctypes.c_int(result)
        data = _CallbackData(site=site, functionName=name.encode(),
                             functionParams=ctypes.cast(ctypes.pointer(params), ctypes.c_void_p) if params else None,
                             functionReturnValue=ctypes.cast(ctypes.pointer(ret), ctypes.c_void_p))
        self.watch._on_call(None, 1, 0, ctypes.addressof(data))

    def alloc(self, name: str, ptr: int, nbytes: int, result: int = 0) -> None:
        out = ctypes.c_uint64(ptr)

        class Params(ctypes.Structure):
            _fields_ = [("dptr", ctypes.POINTER(ctypes.c_uint64)), ("bytesize", ctypes.c_size_t)]

        params = Params(ctypes.pointer(out), nbytes)
        self.call(name, SITE_ENTER, params)
        self.call(name, SITE_EXIT, params, result)

    def free(self, name: str, ptr: int) -> None:
        class Params(ctypes.Structure):
            _fields_ = [("dptr", ctypes.c_uint64)]

        self.call(name, SITE_ENTER, Params(ptr))


@pytest.fixture
def script() -> _Script:
    watch = DeviceWatch(SimpleNamespace(), _Driver({0x9000: 64 * MIB}))
    return _Script(watch)


def test_allocations_by_every_route_raise_the_level_and_frees_lower_it(script):
    w = script.watch
    script.alloc("cuMemAlloc_v2", 0x1000, 100 * MIB)  # cudaMalloc, PyTorch's segments
    script.alloc("cuMemAllocAsync", 0x2000, 20 * MIB)  # cudaMallocAsync
    script.alloc("cuMemCreate", 0x77, 2 * MIB)  # a VMM handle
    assert w.level_bytes == 122 * MIB
    script.free("cuMemFree_v2", 0x1000)
    script.free("cuMemFreeAsync", 0x2000)
    script.free("cuMemRelease", 0x77)
    assert w.level_bytes == 0


def test_the_peak_since_a_mark_sees_a_workspace_freed_before_the_call_returns(script):
    w = script.watch
    script.alloc("cuMemAlloc_v2", 0x1000, 10 * MIB)  # held before the call
    mark = w.mark()
    script.alloc("cuMemAlloc_v2", 0x5000, 1024 * MIB)  # the workspace
    script.free("cuMemFree_v2", 0x5000)
    script.alloc("cuMemAlloc_v2", 0x6000, 4 * MIB)  # the output
    assert w.peak_since(mark) == 1024 * MIB
    assert w.level_bytes - mark.level_bytes == 4 * MIB


def test_the_raw_peak_leaves_the_allocators_segments_out(script):
    """Whether PyTorch asks the driver for a segment depends on its cache, which differs between a
    candidate's child and a baseline's: the raw peak counts only memory outside its segments."""
    w = script.watch
    script.alloc("cuMemAlloc_v2", 0x1000, 10 * MIB)  # before the recording mark
    w.mark(record=True)
    script.alloc("cuMemAlloc_v2", 0x2000, 36 * MIB)  # a PyTorch segment for the output
    script.alloc("cuMemAlloc_v2", 0x5000, 1024 * MIB)  # a raw workspace, freed before return
    script.alloc("cuMemCreate", 0x77, 2 * MIB)  # a raw VMM handle, kept
    script.free("cuMemFree_v2", 0x5000)
    script.free("cuMemFree_v2", 0x1000)  # older memory freed: no raw credit
    script.alloc("cuMemAlloc_v2", 0x6000, 8 * MIB)  # raw again, after the workspace went
    assert w.raw_peak_since({0x2000}) == 1026 * MIB
    w.mark()  # recording ends: later calls are not kept
    script.alloc("cuMemAlloc_v2", 0x7000, 4096 * MIB)
    assert w.raw_peak_since({0x2000}) == 0


def test_a_free_of_memory_allocated_before_the_watch_is_sized_by_the_driver(script):
    w = script.watch
    script.free("cuMemFree_v2", 0x9000)  # 64 MiB, allocated before the watch started
    script.free("cuMemFree_v2", 0xDEAD)  # unknown to the driver: nothing to subtract
    assert w.level_bytes == -64 * MIB


def test_failed_calls_allocate_nothing_and_launches_are_counted(script):
    w = script.watch
    script.alloc("cuMemAlloc_v2", 0x1000, 100 * MIB, result=2)  # CUDA_ERROR_OUT_OF_MEMORY
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyAsync"):
        script.call(name, SITE_ENTER)
    assert w.level_bytes == 0 and w.launches == 2
