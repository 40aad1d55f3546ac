"""Device memory that crosses a process boundary without host memory: CUDA virtual memory management
(`cuMemCreate` with a POSIX file-descriptor handle), through the driver API by ctypes.

The exporter creates a physical allocation, maps it, and hands its file descriptor over a Unix
socket. The importer makes its own handle from the descriptor, maps it into its own address space,
copies, then unmaps and releases. The physical memory lives while any handle or mapping of it does:
an exporter that is killed, hangs, or frees its side early cannot pull the memory from under an
importer in the middle of a copy (legacy `cudaIpc*` handles give no such guarantee), and an importer
that releases leaves nothing of its own behind. Only the exporter's memory is ever shared: kbv's
parent imports what a child exports, and never exports its own.

Nothing here imports torch at module level; `as_tensor` wraps a mapped range as a torch tensor
through `__cuda_array_interface__` (no copy).
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from typing import Any

ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
HANDLE_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
ACCESS_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
GRANULARITY_MINIMUM = 0
ALIGN = 512  # bytes between packed tensors


class VmmError(RuntimeError):
    """A driver call failed (its CUresult in the message)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    """CUmemAllocationProp."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class Driver:
    """The driver API calls VMM needs, bound from the process's libcuda."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        u64, size_t, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
        sig = {
            "cuMemGetAllocationGranularity": [ctypes.POINTER(size_t), ctypes.POINTER(_Prop), ctypes.c_int],
            "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_Prop), u64],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
            "cuMemAddressFree": [u64, size_t],
            "cuMemMap": [u64, size_t, size_t, u64, u64],
            "cuMemUnmap": [u64, size_t],
            "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
            "cuMemRelease": [u64],
            "cuMemExportToShareableHandle": [vp, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), vp, ctypes.c_int],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            setattr(self, name, fn)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.cuGetErrorName(result, ctypes.byref(name))
            raise VmmError(f"{what}: {(name.value or b'CUresult').decode()} ({result})")


_DRIVER: Driver | None = None


def driver() -> Driver:
    """The process's libcuda (loaded by torch's CUDA initialisation). Raises VmmError."""
    global _DRIVER
    if _DRIVER is None:
        try:
            _DRIVER = Driver(ctypes.CDLL("libcuda.so.1"))
        except (OSError, AttributeError) as exc:
            raise VmmError(f"the CUDA driver's VMM calls are not available: {exc}") from exc
    return _DRIVER


def _prop(device: int) -> _Prop:
    d = driver()
    dev = ctypes.c_int()
    d.check(d.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    prop = _Prop()
    prop.type = ALLOCATION_PINNED
    prop.requestedHandleTypes = HANDLE_POSIX_FD
    prop.location.type = LOCATION_DEVICE
    prop.location.id = dev.value
    return prop


def granularity(device: int) -> int:
    d = driver()
    g = ctypes.c_size_t()
    prop = _prop(device)
    d.check(d.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity")
    return int(g.value)


def packed_offsets(nbytes: list[int]) -> tuple[list[int], int]:
    """Offsets of tensors of `nbytes` packed at ALIGN boundaries, and the total size."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-max(n, 1) // ALIGN) * ALIGN
    return offsets, max(end, ALIGN)


@dataclass
class Mapping:
    """A mapped allocation in this process: `ptr` .. `ptr + size`."""

    handle: int
    ptr: int
    size: int
    device: int
    fd: int = -1  # the exporter's descriptor (closed on release)

    def release(self) -> None:
        """Unmap and drop this process's handle (the memory goes once no process holds it)."""
        d = driver()
        if self.ptr:
            d.check(d.cuMemUnmap(self.ptr, self.size), "cuMemUnmap")
            d.check(d.cuMemAddressFree(self.ptr, self.size), "cuMemAddressFree")
            self.ptr = 0
        if self.handle:
            d.check(d.cuMemRelease(self.handle), "cuMemRelease")
            self.handle = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _map(handle: int, size: int, device: int) -> int:
    d = driver()
    ptr = ctypes.c_uint64()
    d.check(d.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "cuMemAddressReserve")
    try:
        d.check(d.cuMemMap(ptr.value, size, 0, handle, 0), "cuMemMap")
        access = _AccessDesc()
        access.location.type = LOCATION_DEVICE
        access.location.id = _prop(device).location.id
        access.flags = ACCESS_READWRITE
        d.check(d.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1), "cuMemSetAccess")
    except VmmError:
        d.cuMemUnmap(ptr.value, size)
        d.cuMemAddressFree(ptr.value, size)
        raise
    return int(ptr.value)


def create(nbytes: int, device: int) -> Mapping:
    """A new exportable allocation of at least `nbytes`, mapped here, with its file descriptor."""
    d = driver()
    g = granularity(device)
    size = -(-max(nbytes, 1) // g) * g
    handle = ctypes.c_uint64()
    prop = _prop(device)
    d.check(d.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), "cuMemCreate")
    mapping = Mapping(int(handle.value), 0, size, device)
    try:
        mapping.ptr = _map(mapping.handle, size, device)
        fd = ctypes.c_int(-1)
        d.check(d.cuMemExportToShareableHandle(ctypes.byref(fd), mapping.handle, HANDLE_POSIX_FD, 0),
                "cuMemExportToShareableHandle")
        mapping.fd = fd.value
    except VmmError:
        mapping.release()
        raise
    return mapping


def open_fd(fd: int, size: int, device: int) -> Mapping:
    """Import an exporter's descriptor (this process takes its own handle; `fd` is closed) and map
    `size` bytes of it. Raises VmmError for a descriptor that is not such an allocation, or one
    smaller than `size`."""
    d = driver()
    handle = ctypes.c_uint64()
    try:
        d.check(d.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), HANDLE_POSIX_FD),
                "cuMemImportFromShareableHandle")
    finally:
        os.close(fd)
    mapping = Mapping(int(handle.value), 0, size, device)
    try:
        mapping.ptr = _map(mapping.handle, size, device)
    except VmmError:
        mapping.release()
        raise
    return mapping


class _Interface:
    """A device range as `__cuda_array_interface__` (bytes), kept alive by the tensor made from it."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def as_tensor(ptr: int, shape: tuple[int, ...], dtype: Any, device: int = 0) -> Any:
    """A torch tensor over memory of CUDA device `device` at `ptr` (no copy; valid while the mapping is)."""
    import torch

    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    where = torch.device("cuda", device)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=where)
    with torch.cuda.device(where):
        raw = torch.as_tensor(_Interface(ptr, nbytes), device=where)
    return raw.view(dtype).view(shape)


def send_fd(sock: socket.socket, fd: int) -> None:
    socket.send_fds(sock, [b"f"], [fd])


def recv_fd(sock: socket.socket, timeout_s: float) -> int:
    """One descriptor from `sock`. Raises TimeoutError, or VmmError when none came with the message."""
    sock.settimeout(timeout_s)
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1, 4)
    finally:
        sock.settimeout(None)
    for extra in fds[1:]:
        os.close(extra)
    if not msg or not fds:
        raise VmmError("no descriptor came with the message")
    return fds[0]
