"""What one call of a problem holds, from its shapes on the meta device: nothing is allocated.

`trace_footprint` builds the problem's `Model` and draws `get_inputs()` under `torch.device("meta")`,
then runs the forward twice under a dispatch mode that follows every storage an operator makes
(alive until its last tensor dies): once as written, once in float64 (the truth's precision). So a
multi-GB problem's memory is known before a byte of it is spent, and `kbv.memory_plan` can fit it
or refuse it with its figures. On CUDA a reduction also takes a staging buffer for the call where it
splits its rows across CTAs (`kbv.cuda_reduce`): the trace adds it at the operator that takes it, to the
CUDA figures (`Footprint.on`). A convolution's cuDNN workspace is not counted: PyTorch asks cuDNN for an
algorithm whose workspace fits what the allocator has free, and moves on to another where one does not.

A problem whose code needs real values to build or run (`.item()`, numpy, a device named outright)
cannot be traced; `trace_footprint` returns None and the caller treats its size as unknown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from kbv.cuda_reduce import (ACCUMULATOR_BYTES, Card, accumulator_bytes, card_of, output_holds_accumulator,
                             reduced_dims, staging_bytes)
from kbv.inputs import flatten_outputs, rng_isolated

# aten operators whose float32 results TF32 changes (cuBLAS GEMMs and cuDNN convolutions): where a
# problem's forward dispatches none, its baseline under TF32 is its strict-fp32 self
TF32_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "vdot", "einsum",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention", "tensordot",
    "convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose", "conv1d", "conv2d",
    "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution_overrideable",
    "_thnn_fused_lstm_cell", "_cudnn_rnn", "lstm", "gru", "rnn_tanh", "rnn_relu", "_thnn_fused_gru_cell",
})


@dataclass(frozen=True)
class Footprint:
    """Bytes of one call of a problem (one input set, its model, its outputs), traced on the meta device.

    `forward_bytes` is the most a forward holds at once beyond its inputs and weights (its
    intermediates and outputs, without autograd); `float64_bytes` the same for the model and inputs
    cast to float64, where the truth is computed. `float64_inputs_bytes` / `float64_weights_bytes` are
    the cast copies themselves. `tf32` says whether the forward dispatches an operator whose float32
    results TF32 changes (`TF32_OPS`)."""

    input_bytes: int
    weight_bytes: int
    output_bytes: int
    forward_bytes: int
    float64_inputs_bytes: int
    float64_weights_bytes: int
    float64_output_bytes: int
    float64_bytes: int
    tf32: bool
    ops: tuple[str, ...] = ()  # the aten operators the forward dispatches, in first-seen order
    # the forward's peaks on CUDA, in its dtype and in float64: the reductions' staging buffers added
    # where they are taken (None: as `forward_bytes` and `float64_bytes`)
    cuda_forward_bytes: int | None = None
    cuda_float64_bytes: int | None = None

    def on(self, device_type: str) -> Footprint:
        """The footprint as a `device_type` device runs it: on CUDA, its forwards' peaks with the
        reductions' staging buffers (`kbv.cuda_reduce`); elsewhere as traced."""
        if device_type != "cuda":
            return self
        return dataclasses.replace(self, forward_bytes=max(self.forward_bytes, self.cuda_forward_bytes or 0),
                                   float64_bytes=max(self.float64_bytes, self.cuda_float64_bytes or 0))

    @property
    def truth_bytes(self) -> int:
        """One trial's truth (its outputs in float64)."""
        return self.float64_output_bytes

    @property
    def truth_call_bytes(self) -> int:
        """What computing one trial's truth holds at its peak: the float64 copies of the model and the
        inputs beside the fp32 originals, and the float64 forward's own peak."""
        return self.input_bytes + self.weight_bytes + self.float64_inputs_bytes + self.float64_weights_bytes \
            + self.float64_bytes

    @property
    def call_bytes(self) -> int:
        """What one plain forward holds at its peak: inputs, weights and the forward's own peak."""
        return self.input_bytes + self.weight_bytes + self.forward_bytes


class _TooLong(Exception):
    """The trace ran past its budget (a recurrent network dispatches an operator per time step)."""


class _Live(TorchDispatchMode):
    """Follows the storages operators make: their bytes while any tensor keeps them alive, and the
    peak. The storages that died are let go before each operator runs, so the peak is what eager
    execution holds at once: an operator's inputs that the caller still keeps, and its results (a
    chain of six elementwise steps on a 2 GiB tensor holds two of them, not six). The inputs' and
    weights' storages (`known`) are alive throughout and cost nothing here. At each reduction, what is
    alive then and the staging buffers it would take on `card`, in its dtype and in float64 (`staged`)."""

    def __init__(self, deadline: float, known: Sequence[torch.Tensor] = (), card: Card = Card()) -> None:
        super().__init__()
        self.card = card
        self.staged: list[tuple[int, int, int]] = []
        self.known = {t.untyped_storage()._cdata for t in known}
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}  # the forward's own storages
        self.live = 0
        self.peak = 0
        self.ops: dict[str, None] = {}
        self.calls = 0
        self.deadline = deadline

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.setdefault(func.overloadpacket.__name__, None)
        self._prune()
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            storage = t.untyped_storage()
            key = storage._cdata
            # a new storage (a view or an in-place result shares its argument's)
            if key not in self.known and key not in self.refs:
                nbytes = storage.nbytes()
                self.refs[key] = (StorageWeakRef(storage), nbytes)
                self.live += nbytes
        self.peak = max(self.peak, self.live)
        temporary = _temporary_bytes(func, args)
        if temporary:  # made and freed inside one operator: the trace sees its result only
            self.peak = max(self.peak, self.live + temporary)
        staging = _staging(func, args, kwargs or {}, self.card)
        if staging is not None:
            self.staged.append((self.live + temporary, *staging))
        self.calls += 1
        if self.calls % 64 == 0 and time.monotonic() > self.deadline:
            raise _TooLong()
        return out

    def _prune(self) -> None:
        for k in [k for k, (ref, _) in self.refs.items() if ref.expired()]:
            self.live -= self.refs.pop(k)[1]


# where a reduction's `dim` sits among its positional arguments (1 for the rest: sum, mean, amax, max, ...)
_DIM_AT = {"norm": 2, "linalg_vector_norm": 2}


def _staging(func: Any, args: Sequence[Any], kwargs: dict[str, Any], card: Card) -> tuple[int, int] | None:
    """The staging buffers (its dtype, float64) a CUDA reduction `func` takes on `args`; None where it
    is not one (`torch.max(a, b)` is elementwise)."""
    name = func.overloadpacket.__name__
    if name not in ACCUMULATOR_BYTES or not args or not isinstance(args[0], torch.Tensor):
        return None
    x, at = args[0], _DIM_AT.get(name, 1)
    dim = kwargs.get("dim", args[at] if len(args) > at else None)
    if isinstance(dim, torch.Tensor) or not (dim is None or isinstance(dim, (int, list, tuple))):
        return None
    integer = not x.is_floating_point() and not x.is_complex()
    # the widest output's elements: an index (argmax, max along a dim) or an integer sum is an int64
    indexed = name in ("argmax", "argmin") or (name in ("max", "min") and dim is not None)
    out_bytes = 8 if indexed or (integer and name in ("sum", "nansum", "prod")) else x.element_size()
    if isinstance(kwargs.get("dtype"), torch.dtype):  # `sum(x, dtype=torch.float64)`: outputs of that dtype
        out_bytes = max(out_bytes, kwargs["dtype"].itemsize)
    try:
        dims = reduced_dims(x.shape, dim)
        return tuple(staging_bytes(x.shape, x.stride(), size, dims, accumulator_bytes(name, wide, integer), card,
                                   output_holds_accumulator(name, size, not integer), out)
                     for size, wide, out in ((x.element_size(), False, out_bytes),
                                             (8, True, 8)))  # type: ignore[return-value]
    except (TypeError, ValueError, IndexError, ZeroDivisionError):  # arguments of a form not foreseen: none counted
        return None


def _temporary_bytes(func: Any, args: Sequence[Any]) -> int:
    """What an operator holds inside itself beyond its result, where a trace cannot see it:
    `logsumexp` (one operator to the dispatcher) makes its input less the maxima, exponentiated, as
    large as its input, before it sums."""
    if func.overloadpacket.__name__ != "logsumexp" or not args or not isinstance(args[0], torch.Tensor):
        return 0
    return args[0].numel() * args[0].element_size()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def tensor_bytes_of(values: Sequence[Any]) -> int:
    """Bytes of the tensors among `values` (each storage once)."""
    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor):
            seen.setdefault(v.untyped_storage()._cdata, v.untyped_storage().nbytes())
    return sum(seen.values())


def _float64(values: Sequence[Any]) -> list[Any]:
    return [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]


def _forward_peak(model: Any, inputs: Sequence[Any], deadline: float, card: Card) -> tuple[_Live, list[torch.Tensor]]:
    """The traced forward (its peak, operators and reductions' staging) and its outputs. The inputs'
    and weights' storages are known from the start: a view of one (a weight transposed for a GEMM)
    costs nothing."""
    mode = _Live(deadline, [*_tensors(list(inputs)), *_weights(model)], card)
    with torch.no_grad(), mode:
        outputs = flatten_outputs(model(*inputs))
    return mode, outputs


TRACE_BUDGET_S = 10.0  # a trace that takes longer (an RNN, step by step) leaves the size unknown


def trace_footprint(module: types.ModuleType, budget_s: float = TRACE_BUDGET_S,
                    card: Card | None = None) -> Footprint | None:
    """The footprint of `module` (an executed problem), or None where its code cannot run on the
    meta device or its trace takes more than `budget_s` (see the module's docstring).

    The forward is traced once, as written. Its float64 figures are scaled from it: every floating
    tensor of the trace at 8 bytes an element instead of its own (a float32 problem's intermediates
    double), an upper bound where some of them are integers. Reductions' staging is worked out for
    `card` (`kbv.cuda_reduce`; by default the current one's, `card_of`)."""
    try:
        with rng_isolated(), torch.device("meta"), _quiet():
            init = list(module.get_init_inputs())
            model = module.Model(*init)
            inputs = list(module.get_inputs())
            if any(isinstance(x, torch.Tensor) and x.device.type != "meta" for x in inputs):
                return None  # it placed its inputs on a device itself: their size is real memory
            weights = _weights(model)
            if any(w.device.type != "meta" for w in weights):
                return None
            mode, outputs = _forward_peak(model, inputs, time.monotonic() + budget_s, card or card_of())
    except Exception:  # noqa: BLE001 - whatever stops a meta trace (or its budget) only means "unknown"
        return None
    scale = _float64_scale([*inputs, *weights, *outputs])
    peak, ops = mode.peak, list(mode.ops)
    cuda_peak = max([peak] + [live + staging for live, staging, _ in mode.staged])
    cuda_peak64 = max([int(peak * scale)] + [int(live * scale) + staging for live, _, staging in mode.staged])
    return Footprint(input_bytes=tensor_bytes_of(inputs), weight_bytes=tensor_bytes_of(weights),
                     output_bytes=tensor_bytes_of(outputs), forward_bytes=peak,
                     float64_inputs_bytes=_float64_bytes(inputs), float64_weights_bytes=_float64_bytes(weights),
                     float64_output_bytes=_float64_bytes(outputs, keep_others=True), float64_bytes=int(peak * scale),
                     tf32=any(op in TF32_OPS for op in ops), ops=tuple(ops), cuda_forward_bytes=cuda_peak,
                     cuda_float64_bytes=cuda_peak64)


def _float64_bytes(values: Sequence[Any], keep_others: bool = False) -> int:
    """Bytes of the floating tensors among `values` cast to float64 (the others as they are, if asked)."""
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * 8 if v.is_floating_point() else (v.numel() * v.element_size() if keep_others else 0)
    return total


def _float64_scale(values: Sequence[Any]) -> float:
    """How much larger a trace's floating tensors are in float64: 8 over the narrowest floating width."""
    widths = [v.element_size() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return 8 / min(widths) if widths else 1.0


def _weights(model: Any) -> list[torch.Tensor]:
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.parameters(), *model.buffers()]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Warnings a problem's code gives on meta tensors are not the user's concern."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def format_bytes(n: float) -> str:
    """'31 GiB', '512 MiB', '3.2 KiB': one significant unit, as a reader wants it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


_FOOTPRINTS: dict[str, Footprint | None] = {}  # problem hash, origin and card -> its footprint (traced once)
_FOOTPRINTS_LOCK = threading.Lock()


def problem_footprint(problem: Any, device: Any = None) -> Footprint | None:
    """The footprint of a `kbv.problems.Problem` on `device` (its reductions' staging depends on the
    card: `kbv.cuda_reduce`), traced once per process and card for both protocols; None where it cannot
    be known (and where the problem's own code fails to execute: its preparation reports that)."""
    from kbv.errors import ProblemError
    from kbv.problems import instantiate_problem

    card = card_of(device)
    key = f"{problem.hash}:{problem.origin}:{card.sms}x{card.threads_per_sm}"
    with _FOOTPRINTS_LOCK:  # lanes of one process plan at once
        if key in _FOOTPRINTS:
            return _FOOTPRINTS[key]
    try:
        module = instantiate_problem(problem)
    except ProblemError:
        return None
    fp = trace_footprint(module, card=card)
    with _FOOTPRINTS_LOCK:
        while len(_FOOTPRINTS) >= 64:
            _FOOTPRINTS.pop(next(iter(_FOOTPRINTS)))
        _FOOTPRINTS[key] = fp
    return fp


def footprint_record(fp: Footprint) -> dict[str, Any]:
    """The footprint's figures for a verdict's evidence (bytes; JSON-safe)."""
    return {"input_bytes": fp.input_bytes, "weight_bytes": fp.weight_bytes, "output_bytes": fp.output_bytes,
            "forward_bytes": fp.forward_bytes, "truth_bytes": fp.truth_bytes, "truth_call_bytes": fp.truth_call_bytes,
            "tf32_ops": fp.tf32,
            **({"cuda_forward_bytes": fp.cuda_forward_bytes}
               if fp.cuda_forward_bytes is not None and fp.cuda_forward_bytes > fp.forward_bytes else {})}
