"""The child's integrity probes (kbv.sandbox.integrity), in this process: poisoned allocations."""

from __future__ import annotations

import pytest
import torch

from kbv.protocols.verified.rules import SENTINEL
from kbv.sandbox.integrity import (
    _cpu_fill_flags,
    aliased_names,
    changed_by_name,
    model_tensors,
    output_storages,
    overwrites,
    poisoned_allocations,
    still_readable,
)

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


class _Swaps(torch.nn.Module):
    """A model whose call replaces one buffer, writes another in place, and makes its output buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("replaced", torch.zeros(4))
        self.register_buffer("written", torch.zeros(4))
        self.register_buffer("kept", torch.ones(4))
        self.register_buffer("out", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.replaced = torch.full((4,), 2.0)  # a new tensor: the one listed before the call is untouched
        self.written.add_(1.0)
        self.out = x * 2
        return self.out


def test_a_call_that_replaces_a_buffer_changes_it_and_an_output_in_a_buffer_made_by_the_call_aliases_it():
    """The model's tensors are read again by name after the call: a buffer replaced rather than written
    in place is changed, and an output held in a buffer the first call made aliases that buffer (a model
    rebuilt for every trial is checked on its first call only)."""
    model = _Swaps()
    names, tensors = model_tensors(model)
    before = [t.clone() for t in tensors]
    out = model(torch.ones(4))
    assert set(changed_by_name(names, before, *model_tensors(model))) == {"replaced", "written"}
    assert aliased_names([out], *model_tensors(model)) == ["out"]
    assert aliased_names([out], names, tensors) == []  # what a list made before the call saw


class _Aliased(torch.nn.Module):
    """The reference's conv weight kept under a name of its own as well (listed first)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 2, 1)
        self.w = self.conv.weight


def test_a_parameter_under_two_names_is_listed_under_both():
    """A change to the reference's conv.weight through its own alias `w` is seen under conv.weight too,
    the reference's name (a name of its own alone would be forgiven as the candidate's own state)."""
    model = _Aliased()
    names, tensors = model_tensors(model)
    assert {"w", "conv.weight"} <= set(names)
    before = [t.clone() for t in tensors]
    with torch.no_grad():
        model.w.mul_(2)
    assert {"w", "conv.weight"} <= set(changed_by_name(names, before, *model_tensors(model)))


def test_an_output_in_a_kept_buffer_overwrites_the_one_before_and_a_fresh_one_never_does():
    """The previous call's outputs are held through the next call, as a caller keeps them: a buffer
    the candidate keeps and returns again (or a view of it) lies in one; a fresh output cannot."""
    buffer = torch.zeros(8)
    kept = output_storages([buffer, torch.zeros(8), "not a tensor"])
    held = still_readable(kept)
    assert len(held) == 2
    assert overwrites(buffer, held) and overwrites(buffer[2:6], held)
    assert not overwrites(torch.zeros(8), held)



def test_an_output_that_hides_its_storage_behind_an_attribute_is_still_seen():
    """A kept buffer handed out as a fresh view each call, whose last view is made to raise on
    `untyped_storage()` (an attribute on the instance shadows the method) or to name another
    storage: torch's own methods are read, so the overwrite is still found, and so is a parameter
    returned behind such an attribute."""
    buffer = torch.zeros(8)
    previous = buffer.view_as(buffer)
    kept = output_storages([previous])

    def refuse():
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten")

    previous.untyped_storage = refuse
    new = buffer.view_as(buffer)
    decoy = torch.zeros(8)
    new.untyped_storage = lambda: decoy.untyped_storage()
    held = still_readable(kept)
    assert len(held) == 1 and overwrites(new, held)
    weight = torch.nn.Parameter(torch.ones(4))
    out = weight.detach()
    out.untyped_storage = lambda: decoy.untyped_storage()
    assert aliased_names([out], ["weight"], [weight]) == ["weight"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_cuda_graph_replay_overwrites_what_a_caller_kept_and_an_output_made_an_error_is_not_counted():
    """torch.compile's "reduce-overhead" replays its graph into the same memory every step: the output
    of the step before, held by a caller, reads the new values without a word, as a buffer the
    candidate keeps does (seen on an H100, torch 2.11). An output torch turned into an error on
    access (what it does to a stale one when it records again) tells its caller, and is not counted."""
    f = torch.compile(lambda x: torch.relu(x) * 2, mode="reduce-overhead")
    x = torch.randn(1024, device="cuda")
    for _ in range(3):  # warm-up, recording, a replay
        f(x)
    first = f(x)
    expected = first.clone()
    kept = output_storages([first])
    new = f(x + 1)
    assert overwrites(new, still_readable(kept))
    assert not torch.equal(first, expected)  # what the caller kept changed: the check is no false alarm
    kept = output_storages([new])
    torch._C._set_storage_access_error_msg(new, "Error: accessing tensor output of CUDAGraphs that has been "
                                                "overwritten by a subsequent run.")
    assert still_readable(kept) == []
