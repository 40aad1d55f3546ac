"""Precision policies (kbv.precision): TF32 flags set for a block and restored, one block at a time in a
process, so that lanes of one process never compute under each other's flags."""

from __future__ import annotations

import threading

import torch

from kbv.precision import precision_policy, snapshot_flags
from lanes import run_lanes


def _tf32_matmul() -> bool:
    return torch.get_float32_matmul_precision() != "highest"


def test_a_lane_under_default_never_computes_under_another_lanes_tf32() -> None:
    """Two lanes of one process: one in a TF32 block (a verified baseline), the other computing the
    standard protocol's reference under the process's own flags. The second waits for the first's
    block to end; it never reads TF32."""
    before = snapshot_flags()
    inside, seen, done = threading.Event(), [], threading.Event()

    def verified_lane() -> None:
        with precision_policy("tf32"):
            inside.set()
            done.wait(timeout=1.0)  # the other lane would have read the flags by now, were it let in

    def standard_lane() -> None:
        inside.wait(timeout=5)
        with precision_policy("default"):
            seen.append(_tf32_matmul())
        done.set()

    run_lanes(verified_lane, standard_lane)
    assert seen == [False]
    assert snapshot_flags() == before


def test_interleaved_blocks_leave_the_process_its_own_flags() -> None:
    """A TF32 block, then an fp32 block begun in another thread before the first ended and ended after
    it: each restored what it found, so the second restored the first's TF32, and the process kept it
    for good. One block at a time, the flags after both are the flags before."""
    before = snapshot_flags()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with precision_policy("tf32"):
            a_in.set()
            b_in.wait(timeout=0.5)
        a_out.set()

    def second() -> None:
        a_in.wait(timeout=5)
        with precision_policy("fp32"):
            b_in.set()
            a_out.wait(timeout=5)

    run_lanes(first, second)
    assert snapshot_flags() == before
    with precision_policy("tf32"), precision_policy("fp32"):  # a thread's own blocks nest
        assert not _tf32_matmul()
