"""The child's integrity probes (kbv.sandbox.integrity), in this process: poisoned allocations."""

from __future__ import annotations

import pytest
import torch

from kbv.protocols.verified.rules import SENTINEL
from kbv.sandbox.integrity import _cpu_fill_flags, poisoned_allocations

CPU = torch.device("cpu")


def test_every_allocation_inside_holds_the_poison_whatever_its_size():
    """A forward's intermediates can be far larger than its output: each one is poisoned, fresh pages
    and reused heap alike, NaN for the first run and zeros for the second on a CPU."""
    with poisoned_allocations(CPU, float("nan"), 1 << 10):
        workspace = torch.empty(16 << 20)  # 64 MiB, far past any block poisoned ahead of the call
        small = torch.empty(300)
    assert bool(torch.isnan(workspace).all()) and bool(torch.isnan(small).all())
    del workspace
    with poisoned_allocations(CPU, SENTINEL, 1 << 10):
        again = torch.empty(16 << 20)
    assert not bool(again.any())


def test_the_allocator_flags_are_restored_on_the_way_out_even_after_a_raise():
    flags = _cpu_fill_flags()
    assert flags is not None, "PyTorch's CPU allocator flags are reachable on Linux"
    with pytest.raises(RuntimeError), poisoned_allocations(CPU, float("nan"), 0):
        raise RuntimeError("the candidate's forward raised")
    assert [f.value for f in flags] == [False, False]
