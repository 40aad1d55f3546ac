"""What a CUDA reduction allocates beside its outputs: the staging buffer of a reduction split across CTAs.

PyTorch runs `sum`, `mean`, `amax`, `max(dim)`, `var` and their kin on CUDA through one reduction
kernel. Where a reduction has few outputs and long rows, it splits each output's inputs across several
CTAs, which write their partial results to a global buffer that one CTA per output then reduces; the
buffer is taken from the caching allocator for the call. Its size is the accumulator's bytes x outputs x
CTAs per output, and x the block's width x the output vector where the block does not reduce along x
(a reduction over a dimension other than the innermost). An input past 2 GiB of offsets is reduced in
32-bit-indexable pieces, each with its own buffer; an accumulator the output's dtype cannot hold (a
value and its index) gets one more buffer, of the whole output, across the pieces.

KernelBench's L1 reductions over the middle of a 128 x 4096 x 2880 float32 tensor take 181 MiB (sum) and
730 MiB (max with indices) this way on an H100, where the forward's own tensors are 1.4 and 4.2 MiB
(docs/gpu/2026-12-07-d). `staging_bytes` works the figure out from the shapes and strides alone (meta
tensors have both), following PyTorch's launch configuration (`ATen/native/cuda/Reduce.cuh`): the
iterator's layout (reduced dimensions first, then coalesced), its 32-bit split, and the CTA split, which
depends on the card's SM count and threads per SM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

INT32_MAX = (1 << 31) - 1
MAX_NUM_THREADS = 512  # a reduction block's threads (256 for complex double, which no problem reduces)
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
INPUT_VEC = 4  # the kernels' default input vector
# an H100's and an H200's: the figures used where the card is not known yet (a trace before CUDA starts)
DEFAULT_SMS, DEFAULT_THREADS_PER_SM = 132, 2048


@dataclass(frozen=True)
class Card:
    """What the CTA split depends on: the card's SM count and the threads an SM runs at once."""

    sms: int = DEFAULT_SMS
    threads_per_sm: int = DEFAULT_THREADS_PER_SM


# aten reductions that run through the shared kernel -> their accumulator's bytes for a float32 input
# (float64 doubles every floating part): a float, a float and its int64 index, Welford's mean, M2, count
ACCUMULATOR_BYTES = {
    "sum": 4, "nansum": 4, "mean": 4, "prod": 4, "amax": 4, "amin": 4, "norm": 4, "linalg_vector_norm": 4,
    "max": 16, "min": 16, "argmax": 16, "argmin": 16, "aminmax": 8,
    "var": 16, "std": 16, "var_mean": 16, "std_mean": 16,
    "logsumexp": 4,  # one opaque operator to a trace: an amax, then a sum, one at a time
}
_FLOAT64_ACCUMULATOR_BYTES = {4: 8, 8: 16, 16: 16}  # a double, a pair of them, a double and its index
_WELFORD = frozenset({"var", "std", "var_mean", "std_mean"})
# accumulators the output's dtype cannot hold (a value and its index, Welford's state, a pair): where the
# input is cut in 32-bit pieces, their partial results cross the pieces in a buffer of their own
UNHELD = frozenset({"max", "min", "argmax", "argmin", "aminmax"}) | _WELFORD


_INTEGER_SUMS = frozenset({"sum", "nansum", "prod"})  # an integer or bool input sums in int64


def accumulator_bytes(op: str, float64: bool, integer: bool = False) -> int:
    """The accumulator's bytes for `op` (a name of ACCUMULATOR_BYTES) in float32 or float64 math, or
    on an `integer` input."""
    acc = ACCUMULATOR_BYTES[op]
    if integer and op in _INTEGER_SUMS:
        return 8
    if not float64:
        return acc
    return 32 if op in _WELFORD else _FLOAT64_ACCUMULATOR_BYTES[acc]


def output_holds_accumulator(op: str, dtype_bytes: int, floating: bool) -> bool:
    """Whether the output's dtype holds the accumulator (else partial results cross the 32-bit pieces
    in a buffer of their own): not a value and its index, Welford's state or a pair, nor a float16 or
    bfloat16 sum, which accumulates in float32."""
    return op not in UNHELD and not (floating and dtype_bytes == 2)


def card_of(device: Any = None) -> Card:
    """The figures of `device` (a CUDA device, `torch.device` or name): its SM count and threads per SM.
    With no device named, the current one's where CUDA has started in this process, else an H100's and
    an H200's (a trace before CUDA starts; a CPU run's footprint, which no CUDA plan reads)."""
    import torch

    where = torch.device(device) if device is not None else None
    if where is not None and where.type != "cuda":
        return Card()
    if where is None:
        if not torch.cuda.is_initialized():
            return Card()
        where = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(where.index if where.index is not None else torch.cuda.current_device())
    return Card(props.multi_processor_count, getattr(props, "max_threads_per_multi_processor", DEFAULT_THREADS_PER_SM))


def reduced_dims(shape: Sequence[int], dim: int | Sequence[int] | None) -> tuple[int, ...]:
    """The dimensions a reduction's `dim` argument names (every one where it is None or empty)."""
    ndim = len(shape)
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({d % ndim for d in dims})) if ndim else ()


def staging_bytes(shape: Sequence[int], strides: Sequence[int], element_bytes: int, dims: Sequence[int],
                  acc_bytes: int, card: Card = Card(), outputs_fit_acc: bool = True,
                  out_bytes: int | None = None) -> int:
    """Bytes the reduction of a tensor of `shape` and `strides` (in elements, `element_bytes` each) over
    `dims` allocates beside its outputs on `card`: the largest piece's staging buffer and semaphores, and
    where the accumulator does not fit the output's dtype (`outputs_fit_acc` False) and the input is cut in
    pieces, the buffer that carries the partial results across them. 0 where nothing is split. The
    outputs' elements are `out_bytes` each (default: the input's; an index is 8), which the cut into
    32-bit pieces reads as it reads the input's."""
    widths = (element_bytes, out_bytes if out_bytes is not None else element_bytes)
    numel = math.prod(shape)
    if numel == 0 or not shape:
        return 0
    sizes, in_strides, out_strides = _layout(shape, strides, dims)
    reduce_dims = sum(1 for s in out_strides if s == 0)
    out_elements = math.prod(n for n, s in zip(sizes, out_strides) if s != 0)
    across = 0 if outputs_fit_acc or _fits_32bit(sizes, in_strides, out_strides, widths) \
        else out_elements * acc_bytes
    largest = max((_config_bytes(piece, in_s, out_s, reduce_dims, acc_bytes, card)
                   for piece, in_s, out_s in _pieces(sizes, in_strides, out_strides, widths)), default=0)
    return largest + across


def _layout(shape: Sequence[int], strides: Sequence[int], dims: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The iterator's dimensions, fastest first: sizes, the input's strides and the output's (0 where
    reduced; the output contiguous over the kept dimensions), reduced dimensions moved to the front,
    the rest ordered by stride, then adjacent dimensions coalesced where every operand allows."""
    ndim = len(shape)
    reduced = set(dims)
    out_stride, step = [0] * ndim, 1
    for d in reversed(range(ndim)):
        if d not in reduced:
            out_stride[d], step = step, step * shape[d]
    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):  # insertion sort with ambiguous comparisons, as the iterator does
        j1 = i
        for j0 in range(i - 1, -1, -1):
            c = _should_swap(perm[j0], perm[j1], shape, strides, out_stride)
            if c > 0:
                perm[j0], perm[j1] = perm[j1], perm[j0]
                j1 = j0
            elif c < 0:
                break
    sizes = [shape[d] for d in perm]
    ins, outs = [strides[d] for d in perm], [out_stride[d] for d in perm]
    return _coalesce(sizes, ins, outs)


def _should_swap(d0: int, d1: int, shape: Sequence[int], in_s: Sequence[int], out_s: Sequence[int]) -> int:
    # the output first: reduced dimensions (stride 0) go to the front
    if (out_s[d0] == 0) != (out_s[d1] == 0):
        return 1 if out_s[d1] == 0 else -1
    for strides in (out_s, in_s):
        s0, s1 = strides[d0], strides[d1]
        if s0 == 0 or s1 == 0:
            continue
        if s0 != s1:
            return -1 if s0 < s1 else 1
        if shape[d0] > shape[d1]:
            return 1
    return 0


def _coalesce(sizes: list[int], ins: list[int], outs: list[int]) -> tuple[list[int], list[int], list[int]]:
    if not sizes:
        return sizes, ins, outs
    n, i_s, o_s = [sizes[0]], [ins[0]], [outs[0]]
    for size, si, so in zip(sizes[1:], ins[1:], outs[1:]):
        if n[-1] == 1 or size == 1 or (n[-1] * i_s[-1] == si and n[-1] * o_s[-1] == so):
            if n[-1] == 1:
                i_s[-1], o_s[-1] = si, so
            n[-1] *= size
        else:
            n.append(size)
            i_s.append(si)
            o_s.append(so)
    return n, i_s, o_s


def _fits_32bit(sizes: Sequence[int], ins: Sequence[int], outs: Sequence[int], widths: tuple[int, int]) -> bool:
    """Whether every operand's largest offset, in bytes of its own elements (`widths`: the input's, the
    outputs'), fits 32 bits."""
    if math.prod(sizes) > INT32_MAX:
        return False
    for strides, width in zip((ins, outs), widths):
        if 1 + sum((n - 1) * s * width for n, s in zip(sizes, strides)) > INT32_MAX:
            return False
    return True


def _pieces(sizes: list[int], ins: list[int], outs: list[int],
            widths: tuple[int, int]) -> list[tuple[list[int], list[int], list[int]]]:
    """The iterator cut in halves along its widest dimension until every piece's offsets fit 32 bits
    (the pieces of one cut differ by one row at most: both kept, each cut again as needed)."""
    if _fits_32bit(sizes, ins, outs, widths):
        return [(sizes, ins, outs)]
    widest, extent = 0, -1
    for d in reversed(range(len(sizes))):
        for strides, width in zip((ins, outs), widths):
            e = (sizes[d] - 1) * abs(strides[d]) * width
            if e > extent:
                widest, extent = d, e
    if sizes[widest] <= 1:
        return [(sizes, ins, outs)]
    pieces = []
    for half in {sizes[widest] // 2, sizes[widest] - sizes[widest] // 2}:
        cut = list(sizes)
        cut[widest] = half
        pieces += _pieces(cut, ins, outs, widths)
    return pieces


def _config_bytes(sizes: list[int], ins: list[int], outs: list[int], reduce_dims: int, acc_bytes: int,
                  card: Card) -> int:
    """The staging buffer and semaphores of one 32-bit piece: the launch configuration PyTorch picks."""
    ndim = len(sizes)
    num_outputs = math.prod(n for n, s in zip(sizes, outs) if s != 0)
    inputs_per_output = math.prod(sizes) // max(num_outputs, 1)
    on_fastest = reduce_dims == ndim or ins[0] < ins[reduce_dims]
    dim0, dim1 = (inputs_per_output, num_outputs) if on_fastest else (num_outputs, inputs_per_output)
    fastest = ins[0] if on_fastest else ins[reduce_dims]
    out_vec = 1
    if fastest == 1:
        if on_fastest and dim0 >= 128 and reduce_dims == 1:
            dim0 //= INPUT_VEC
        elif not on_fastest:
            out_vec = _output_vec(sizes[reduce_dims], [s for k, s in enumerate(ins) if k != reduce_dims])
            dim0 //= out_vec
    max_threads = MAX_NUM_THREADS // out_vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(d0, WARP)
    height = min(d1, max_threads // width)
    width = min(d0, max_threads // height)
    threads = width * height
    step_in = step_out = 1
    if on_fastest:
        step_in *= width
    else:
        step_out *= width
    if -(-inputs_per_output // step_in) < min(height * 16, MAX_VALUES_PER_THREAD):
        return 0  # each warp takes outputs of its own: nothing crosses CTAs
    step_in *= height
    values = -(-inputs_per_output // step_in)
    target = card.sms * (card.threads_per_sm // threads)
    grid = -(-(num_outputs // out_vec) // step_out)
    if values < MAX_VALUES_PER_THREAD or grid > target:
        return 0
    ctas = max(min(-(-target // grid), -(-values // MIN_VALUES_PER_THREAD)), -(-values // MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return 0
    staging = acc_bytes * num_outputs * ctas * (1 if on_fastest else width * out_vec)
    return staging + 4 * grid


def _output_vec(extent: int, strides: Sequence[int]) -> int:
    vec = 4
    for n in (extent, *strides):
        while n % vec:
            vec //= 2
    return vec


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))
