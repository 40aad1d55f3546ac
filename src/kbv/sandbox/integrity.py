"""Integrity probes run inside the child around one forward: pure functions of tensors and modules.

They report what they see; the parent decides. (A hostile candidate can tamper with this code in its
own process; the parent's value checks do not depend on it, and what it reports is evidence.)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


POISON_BYTES_MIN = 1 << 20
POISON_SHARE_OF_FREE = 0.25  # the most of the device's free memory poisoning may add to the allocator's cache
SMALL_REQUEST_BYTES = 1 << 20  # CUDA's caching allocator serves requests up to this from its small pool


def bitwise_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers, so NaN == NaN and -0.0 != 0.0."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)
    if t.dtype == torch.bool:
        return t.reshape(-1)
    return t.reshape(-1).view(torch.uint8)


def snapshot(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


def changed(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> list[int]:
    """Indices whose bytes differ."""
    return [i for i, (b, a) in enumerate(zip(before, after))
            if b.shape != a.shape or not torch.equal(bitwise_view(b), bitwise_view(a))]


def changed_by_name(names: Sequence[str], before: Sequence[torch.Tensor], names_after: Sequence[str],
                    after: Sequence[torch.Tensor]) -> dict[str, list[Any]]:
    """The model's tensors that a call changed, by name: name -> `state_print` of what it holds now.
    Read after the call by name, so that a buffer the call replaced (rather than wrote in place) or
    removed counts too; one the call added is new state, not a change of the model's."""
    now = dict(zip(names_after, after))
    return {n: state_print(now[n]) if n in now else [[0], 0.0, 0.0]  # a removed tensor reads as an empty one
            for n, b in zip(names, before) if n not in now or _differs(b, now[n])}


def _differs(before: torch.Tensor, after: torch.Tensor) -> bool:
    return (before.shape != after.shape or before.device != after.device or before.dtype != after.dtype
            or not torch.equal(bitwise_view(before), bitwise_view(after)))


def aliased_names(outs: Sequence[Any], names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[str]:
    """The names of the model's tensors (as they are after the call: a buffer the call made too) that
    share storage with an output."""
    return sorted({names[i] for o in outs if isinstance(o, torch.Tensor) for i in overlapping(o, tensors)})


def state_print(t: torch.Tensor) -> list[Any]:
    """[shape, sum, sum of squares] of a tensor in float64: what a changed parameter or buffer became,
    compared with what the reference's own call made of its state (BatchNorm's running statistics)."""
    x = t.detach().double()
    return [list(t.shape), float(x.sum()), float((x * x).sum())]


# A tensor's storage, its address and size, and its device, read through torch's own C methods bound
# here, before any candidate code is imported: neither an attribute set on an output (`untyped_storage`
# is a method, which an instance's attribute shadows) nor a method patched onto `torch.Tensor` or
# `torch.UntypedStorage` reaches them, and no subclass's `__torch_function__` runs (`_storage`).
_untyped_storage = torch._C.TensorBase.untyped_storage
_storage_data_ptr = torch._C.StorageBase.data_ptr
_storage_nbytes = torch._C.StorageBase.nbytes
_tensor_device = torch._C.TensorBase.device.__get__
_storage_device = torch._C.StorageBase.device.__get__
_copy = torch._C.TensorBase.copy_
_detach = torch._C.TensorBase.detach
_no_function_hooks = torch._C.DisableTorchFunction
_no_dispatch_hooks = torch._C._DisableTorchDispatch


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` by value, through torch's own methods bound here, with torch's function and
    dispatch hooks off: neither a method patched onto `torch.Tensor`, nor a subclass's hooks, nor a
    mode the candidate entered and left on the stack runs any code of its own on the harness's copy."""
    with _no_function_hooks(), _no_dispatch_hooks():
        _copy(dst, _detach(src))


def _storage(t: torch.Tensor) -> Any:
    with torch._C.DisableTorchFunctionSubclass():
        return _untyped_storage(t)


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = _storage(t)
    start = _storage_data_ptr(storage)
    return start, start + _storage_nbytes(storage)


def overlapping(out: torch.Tensor, others: Sequence[torch.Tensor]) -> list[int]:
    """Indices of `others` whose storage overlaps the storage of `out`."""
    if _storage_nbytes(_storage(out)) == 0:
        return []
    lo, hi = storage_span(out)
    hits = []
    for i, o in enumerate(others):
        if _tensor_device(o) != _tensor_device(out) or _storage_nbytes(_storage(o)) == 0:
            continue
        olo, ohi = storage_span(o)
        if lo < ohi and olo < hi:
            hits.append(i)
    return hits


def output_storages(outs: Sequence[Any]) -> list[torch.Tensor]:
    """Each strided tensor output, held until the next call returns, as a caller who keeps its
    outputs holds them: that call must not change what they read (`still_readable`). Held, their
    memory cannot be handed to the next call's outputs by an allocator: only a buffer the candidate
    keeps (wherever: a parameter, an attribute, a module global, a cache) can lie there."""
    return [o for o in outs if isinstance(o, torch.Tensor) and o.layout == torch.strided]


def still_readable(kept: Sequence[torch.Tensor]) -> list[Any]:
    """The storages of the outputs `kept` that still read after the next call. An output its maker
    turned into an error on access (CUDA graph trees do so to a stale output of theirs when a new run
    starts, so that a caller who kept one is told) is not among them; a buffer the candidate keeps and
    writes again changes silently, and is."""
    out = []
    for t in kept:
        try:  # torch's own methods (`_storage`): an attribute that raises, set on the output, is not read
            storage = _storage(t)
            _storage_data_ptr(storage)
        except RuntimeError:  # torch's "accessing tensor output of CUDAGraphs that has been overwritten"
            continue
        out.append(storage)
    return out


def overwrites(out: torch.Tensor, storages: Sequence[Any]) -> bool:
    """Whether `out` lies in one of `storages` (a previous call's outputs, still held)."""
    if out.layout != torch.strided or _storage_nbytes(_storage(out)) == 0:
        return False
    lo, hi = storage_span(out)
    device = _tensor_device(out)
    return any(_storage_device(st) == device and _storage_nbytes(st)
               and lo < _storage_data_ptr(st) + _storage_nbytes(st) and _storage_data_ptr(st) < hi
               for st in storages)


def model_tensors(model: Any) -> tuple[list[str], list[torch.Tensor]]:
    """Names and tensors of a module's parameters and buffers."""
    if not isinstance(model, torch.nn.Module):
        return [], []
    # every name a tensor has (a parameter kept under a name of the candidate's own as well as the
    # reference's: a change is seen under both, and the reference's name decides)
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    return [n for n, _ in named], [t for _, t in named]


@contextlib.contextmanager
def poisoned_allocations(device: torch.device, value: float, nbytes: int) -> Iterator[None]:
    """Inside, the memory a forward can be handed by PyTorch's allocator holds poison, so that what a
    kernel never writes shows in what it returns.

    CUDA: before the call, every free block the caching allocator keeps for the current stream (what
    the forward's allocations are carved from: its own last call's intermediates among them) is
    filled with `value`, after the cache has been grown to hold at least `nbytes` free (within
    POISON_SHARE_OF_FREE of the device's free memory). A request larger than everything cached gets
    a fresh segment, unpoisoned.
    CPU: glibc's free chunks cannot be listed, so PyTorch's CPU allocator fills every allocation made
    inside instead (its `caffe2_cpu_allocator_do_junk_fill` flag: NaN as float32, every other element
    as float16; `do_zero_fill` for any `value` but NaN: zeros), and the flags are restored on the way
    out. Where the flags cannot be reached, a freed block of `nbytes` holds `value`, which glibc often
    hands to the next allocation of a similar size.
    """
    nbytes = max(int(nbytes), POISON_BYTES_MIN)
    if device.type == "cuda":
        _poison_cached_blocks(device, value, nbytes)
        yield
        return
    flags = _cpu_fill_flags()
    if flags is None:
        _poison_freed_block(device, value, nbytes)
        yield
        return
    junk, zero = flags
    saved = junk.value, zero.value
    junk.value, zero.value = math.isnan(value), not math.isnan(value)
    try:
        yield
    finally:
        junk.value, zero.value = saved


def _poison_cached_blocks(device: torch.device, value: float, nbytes: int) -> None:
    """Fill every free block of the caching allocator's for the current stream with `value`. Each is
    taken back by a request of its exact size, smallest first (the allocator hands out the smallest
    free block that fits, so each request gets the block it was sized on), filled, and freed."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    sizes = _free_block_sizes(index, stream)
    want = min(nbytes, int(torch.cuda.mem_get_info(device)[0] * POISON_SHARE_OF_FREE))
    if sum(sizes) < want:
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            torch.empty(want // 4, dtype=torch.float32, device=device)  # a segment of its own, freed to the cache
            sizes = _free_block_sizes(index, stream)
    held = [torch.empty(size // 4, dtype=torch.float32, device=device) for size in sorted(sizes)]
    for block in held:
        block.fill_(value)
    del held


def _free_block_sizes(index: int, stream: int) -> list[int]:
    """The sizes of the caching allocator's free blocks on device `index` for `stream`, in requests
    it serves from the pool each block is in (a small-pool block of 2 MiB as two of 1 MiB)."""
    sizes = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != index or segment.get("stream") != stream:
            continue
        small = segment.get("segment_type") == "small"
        for block in segment.get("blocks", []):
            if block.get("state") == "inactive":
                size = int(block["size"])
                while small and size > SMALL_REQUEST_BYTES:
                    sizes.append(SMALL_REQUEST_BYTES)
                    size -= SMALL_REQUEST_BYTES
                sizes.append(size)
    return sizes


@functools.lru_cache(maxsize=1)
def _cpu_fill_flags() -> tuple[ctypes.c_bool, ctypes.c_bool] | None:
    """PyTorch's CPU allocator's fill flags (c10's globals), None where they cannot be reached."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return (ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_cpu_allocator_do_junk_fill"),
                ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_cpu_allocator_do_zero_fill"))
    except (OSError, ValueError):
        return None


def _poison_freed_block(device: torch.device, value: float, nbytes: int) -> None:
    """Allocate, fill and free a block of `nbytes` twice: the first frees an mmapped block, which moves
    glibc's mmap threshold above it, so the second comes from the heap and is reused."""
    for _ in range(2):
        block = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        block.fill_(value)
        del block


def describe_output(out: Any) -> dict[str, Any]:
    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__, "tensor": False}
    return {"type": type(out).__name__, "tensor": True, "exact_type": type(out) is torch.Tensor,
            "shape": list(out.shape), "dtype": str(out.dtype).removeprefix("torch."),
            "device": str(out.device), "strided": out.layout == torch.strided,
            "internal_overlap": out.layout == torch.strided and any(
                st == 0 and sz > 1 for st, sz in zip(out.stride(), out.shape))}


def fingerprint(outs: Sequence[Any]) -> list[int]:
    """A cheap content hash per tensor output (bytes summed with position weights)."""
    prints = []
    for o in outs:
        if not isinstance(o, torch.Tensor) or type(o) is not torch.Tensor or o.numel() == 0:
            prints.append(0)
            continue
        b = bitwise_view(o)
        if b.numel() > 1 << 24:  # a strided sample keeps big outputs cheap to fingerprint
            b = b[:: b.numel() // (1 << 24) + 1]
        b = b.to(torch.int64)
        weights = torch.arange(1, b.numel() + 1, device=b.device, dtype=torch.int64) % 65521
        prints.append(int((b * weights).sum()) ^ int(b.sum()))
    return prints


def changes_later(outs: Sequence[Any], clock: Any, wait_s: float = 0.02) -> bool:
    """Whether an output changes after the call returned and the device was synchronised (a thread or
    a late stream still writing)."""
    import time

    first = fingerprint(outs)
    time.sleep(wait_s)
    clock.sync()
    return fingerprint(outs) != first


def write_late(tensors: Sequence[torch.Tensor], sleep: Callable[[int], None], cycles: int) -> None:
    """Make the inputs' values arrive late: poison them now, then queue, on the current stream, a spin
    of `cycles` followed by the copy of the real values. Work that waits for the current stream (as
    every kernel launched on it, and every stream joined to it, does) reads the real inputs; work on a
    stream that does not wait reads the poison."""
    late = [(t, t.clone()) for t in tensors if t.is_cuda and t.numel() and not _self_overlapping(t)]
    for t, _ in late:
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.logical_not_()
        else:
            t.bitwise_not_()
    torch.cuda.synchronize(late[0][0].device if late else None)
    sleep(cycles)
    for t, real in late:
        t.copy_(real)


def _self_overlapping(t: torch.Tensor) -> bool:
    """An expanded view (a zero stride over more than one element) cannot be filled in place."""
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape))


def unjoined_work(outs: Sequence[Any], device: torch.device) -> bool:
    """Whether, at return, an output is still being written by work the current stream does not wait
    for: a copy taken in stream order right away differs from the output once the device is idle."""
    if device.type != "cuda":
        return False
    tensors = [o for o in outs if type(o) is torch.Tensor and o.is_cuda and o.numel()]
    if not tensors:
        return False
    early = [t.clone() for t in tensors]  # enqueued on the current stream, no synchronisation
    torch.cuda.synchronize(device)
    return any(not torch.equal(bitwise_view(e), bitwise_view(t)) for e, t in zip(early, tensors))
