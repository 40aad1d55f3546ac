"""Persisting-L2 control (kbv.sandbox.l2) against a scripted CUDA runtime, and the impossible-speed bound.

On a GPU the same code runs against the process's libcudart (tests/corpus/gpu/…persisting_l2)."""

from __future__ import annotations

import ctypes

import pytest

from kbv.sandbox.l2 import ACCESS_PERSISTING, LIMIT_PERSISTING_L2, PersistingL2, mapped_library
from kbv.detect.speed import impossible_speed
from kbv.protocols.verified.rules import IMPOSSIBLE_FACTOR
from kbv.verdict import Category


class _Fn:
    """A stand-in for a ctypes function pointer: takes argtypes and restype, returns a CUDA error code."""

    def __init__(self, body):
        self.body = body

    def __call__(self, *args):
        return self.body(*args)


class Runtime:
    """The five runtime calls kbv.sandbox.l2 makes, with a context's persisting state behind them."""

    def __init__(self, limit=0, settable=True):
        self.limit, self.settable, self.lines_reset = limit, settable, 0
        self.window = (0, 0.0, 0)  # num_bytes, hit ratio, hit property
        self.pending_error = 0
        for name in ("cudaDeviceSetLimit", "cudaDeviceGetLimit", "cudaCtxResetPersistingL2Cache",
                     "cudaStreamGetAttribute", "cudaGetLastError"):
            setattr(self, name, _Fn(getattr(self, "_" + name)))

    def _cudaDeviceSetLimit(self, which, value):
        assert which == LIMIT_PERSISTING_L2
        if not self.settable:
            self.pending_error = 801  # cudaErrorNotSupported
            return 801
        self.limit = value
        return 0

    def _cudaDeviceGetLimit(self, out, which):
        out._obj.value = self.limit
        return 0

    def _cudaCtxResetPersistingL2Cache(self):
        self.lines_reset += 1
        return 0

    def _cudaStreamGetAttribute(self, stream, attr, out):
        w = out._obj.window
        w.num_bytes, w.hit_ratio, w.hit_prop = self.window
        return 0

    def _cudaGetLastError(self):
        code, self.pending_error = self.pending_error, 0
        return code


def test_the_control_takes_away_any_set_aside_and_sees_one_raised_again():
    rt = Runtime(limit=8 << 20)  # a default set-aside (an MPS percentage)
    control = PersistingL2.attach(rt, "libcudart.so.13")
    assert rt.limit == 0 and control.floor == 0 and rt.lines_reset == 1
    assert control.state(0).evidence() is None
    rt.limit = 30 << 20  # what the candidate's extension did during its call
    said = control.state(0).evidence()
    assert said is not None and "30.0 MiB persisting-L2 set-aside" in said
    control.reset()
    assert rt.limit == 0 and rt.lines_reset == 2 and control.state(0).evidence() is None


def test_a_persisting_window_on_the_stream_is_named_a_normal_one_is_not():
    rt = Runtime()
    control = PersistingL2.attach(rt, "libcudart.so.13")
    rt.window = (16 << 20, 1.0, 0)  # a window whose hits stay normal: harmless
    assert control.state(1234).evidence() is None
    rt.window = (16 << 20, 1.0, ACCESS_PERSISTING)
    assert "persisting access-policy window of 16.0 MiB" in control.state(1234).evidence()


def test_a_runtime_that_refuses_the_reset_leaves_no_error_behind_and_accuses_no_one():
    rt = Runtime(limit=4 << 20, settable=False)
    control = PersistingL2.attach(rt, "libcudart.so.13")
    # the refused call's error was taken, so the next launch check of torch does not see it
    assert rt.pending_error == 0 and "cudaDeviceSetLimit returned CUDA error 801" in control.problem
    assert control.floor == 4 << 20 and control.state(0).evidence() is None


def test_mapped_library_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /opt/env/lib/nvidia/cu13/lib/libcudart.so.13\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n")
    assert mapped_library("libcudart", maps) == "/opt/env/lib/nvidia/cu13/lib/libcudart.so.13"
    assert mapped_library("libcublas", maps) is None
    assert mapped_library("libcudart", tmp_path / "absent") is None


def test_this_process_maps_its_own_c_library():
    # the real /proc/self/maps of a CPU process: libc is there, libcudart is not
    path = mapped_library("libc")
    assert path is not None and ctypes.CDLL(path).strlen(b"kbv") == 3


def test_impossible_speed_needs_more_than_the_factor_times_copy_bandwidth():
    # 1 GB in 0.25 ms is 4000 GB/s: fine on a 3000 GB/s device, impossible on a 1000 GB/s one
    assert impossible_speed(10**9, 0.25, 3000.0) is None
    found = impossible_speed(10**9, 0.25, 1000.0)
    assert found is not None and found[0] is Category.IMPOSSIBLE_SPEED and "4000 GB/s" in found[1]
    assert impossible_speed(10**9, 0.25, 4000.0 / IMPOSSIBLE_FACTOR) is None  # at the bound, not above
    assert impossible_speed(0, 0.25, 1000.0) is None  # nothing known to move


@pytest.mark.parametrize("missing", [0.0, -1.0])
def test_impossible_speed_says_nothing_without_figures(missing):
    assert impossible_speed(10**9, 0.25, missing) is None
    assert impossible_speed(10**9, missing, 1000.0) is None
