"""Persisting-L2 control for the timer (catalogue A8).

Since Ampere a context can set aside part of L2 for "persisting" lines (`cudaLimitPersistingL2CacheSize`)
and mark a window of memory as persisting on a stream (an access-policy window). Persisting lines
survive the timer's flush, so a candidate that pins its inputs is timed on a warm cache. Before each
timed call the child sets the set-aside back to zero and demotes persisting lines to normal; after
each call it reads the set-aside and the current stream's window again: a candidate that raised them
is named. Without a set-aside no line can persist, whatever windows a stream carries.

The runtime functions come from the libcudart the process has already mapped (torch's), bound before
any candidate import. Where that library is not found or a call is not supported, the control is
absent and says so; a failed call's error is cleared so that it never surfaces in later work.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize
ATTR_ACCESS_POLICY_WINDOW = 1  # cudaStreamAttributeAccessPolicyWindow (= cudaLaunchAttributeAccessPolicyWindow)
ACCESS_PERSISTING = 2  # cudaAccessPropertyPersisting


class _Window(ctypes.Structure):
    """cudaAccessPolicyWindow, at the start of the attribute-value union."""

    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hit_ratio", ctypes.c_float),
                ("hit_prop", ctypes.c_int), ("miss_prop", ctypes.c_int)]


class _AttrValue(ctypes.Union):
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 256)]  # the union is 64 bytes today


def mapped_library(stem: str, maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of a shared library this process has mapped whose file name starts with `stem`."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith(stem + ".so"):
            return path
    return None


@dataclass(frozen=True)
class L2State:
    limit_bytes: int  # the persisting set-aside
    window_bytes: int  # the current stream's persisting window (0: none)
    floor_bytes: int = 0  # the set-aside the harness itself could not take away

    def evidence(self) -> str | None:
        said = []
        if self.limit_bytes > self.floor_bytes:
            said.append(f"a {self.limit_bytes / (1 << 20):.1f} MiB persisting-L2 set-aside")
        if self.window_bytes > 0:
            said.append(f"a persisting access-policy window of {self.window_bytes / (1 << 20):.1f} MiB on the stream")
        return " and ".join(said) or None


class PersistingL2:
    """Reset and read the persisting-L2 state of the current device's context (see the module doc)."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._set_limit = lib.cudaDeviceSetLimit
        self._set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        self._get_limit = lib.cudaDeviceGetLimit
        self._get_limit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        self._reset_lines = lib.cudaCtxResetPersistingL2Cache
        self._reset_lines.argtypes = []
        self._stream_attr = lib.cudaStreamGetAttribute
        self._stream_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_AttrValue)]
        self._last_error = lib.cudaGetLastError
        self._last_error.argtypes = []
        for fn in (self._set_limit, self._get_limit, self._reset_lines, self._stream_attr, self._last_error):
            fn.restype = ctypes.c_int
        self.problem: str | None = None  # why the control does not hold, once a call failed
        self.floor = 0  # the set-aside left after the harness's own reset (0 where the reset works)

    @classmethod
    def bind(cls) -> PersistingL2 | None:
        """Bind to the process's libcudart (the CUDA context must exist); None where there is none."""
        path = mapped_library("libcudart")
        if path is None:
            return None
        try:
            return cls.attach(ctypes.CDLL(path), path)
        except (OSError, AttributeError):
            return None

    @classmethod
    def attach(cls, lib: ctypes.CDLL, path: str) -> PersistingL2:
        control = cls(lib, path)
        control.reset()  # whatever default the environment set (an MPS percentage, say) goes first
        control.floor = control.limit_bytes()
        return control

    def _ok(self, code: int, what: str) -> bool:
        if code != 0:
            self._last_error()  # a failed runtime call leaves its error for the next launch check: take it
            self.problem = self.problem or f"{what} returned CUDA error {code}"
        return code == 0

    def reset(self) -> None:
        """No set-aside, no persisting lines: what the flush then evicts, stays evicted."""
        self._ok(self._set_limit(LIMIT_PERSISTING_L2, 0), "cudaDeviceSetLimit")
        self._ok(self._reset_lines(), "cudaCtxResetPersistingL2Cache")

    def limit_bytes(self) -> int:
        """The persisting-L2 set-aside of the context (0 where it cannot be read)."""
        limit = ctypes.c_size_t(0)
        ok = self._ok(self._get_limit(ctypes.byref(limit), LIMIT_PERSISTING_L2), "cudaDeviceGetLimit")
        return int(limit.value) if ok else 0

    def state(self, stream: int) -> L2State:
        """The set-aside and the persisting window on `stream` (a cudaStream_t as an int)."""
        limit_bytes = self.limit_bytes()
        value = _AttrValue()
        window = 0
        read = self._ok(self._stream_attr(ctypes.c_void_p(stream), ATTR_ACCESS_POLICY_WINDOW, ctypes.byref(value)),
                        "cudaStreamGetAttribute")
        if read and value.window.hit_prop == ACCESS_PERSISTING and value.window.hit_ratio > 0:
            window = int(value.window.num_bytes)
        return L2State(limit_bytes, window, self.floor)
