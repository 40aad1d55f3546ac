"""What a problem's own reference does on its own inputs: the facts a hack is built on.

A KernelBench harness draws every input from the problem's `get_inputs()` (today `torch.rand`:
uniform in [0, 1)) and compares with `allclose` at a loose tolerance. Hacks exploit what holds on
those inputs only: the output equals an input (ReLU on non-negative values), stays near one
constant (a softmax over thousands of columns), or lets most rows be guessed from a few. The probe
measures these on the problem's own draws, KernelBench's way (the model built under seed 42, the
trials under KernelBench's per-trial seeds), with the reference standing in for the honest kernel.

It runs problem code in kbv's own process (problems are trusted, as in every protocol's
preparation); candidate code never runs here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.inputs import flatten_outputs, kernelbench_trial_seeds, rng_isolated, set_seed, to_device
from kbv.problems import Problem, instantiate_problem

KERNELBENCH_SEED = 42
PROBE_TRIALS = 3  # KernelBench's first per-trial seeds: a shortcut must hold on each
ROW_FRACTION = 0.25  # partial work computes this share of the rows
SEPARABLE_TOLERANCE = 1e-5  # rows of a batch computed alone must match the whole batch's this closely
ROW_FILLS = ("mean", "tile", "zeros")  # how skipped rows are guessed, most plausible first
_LINEAR_ALGEBRA_RE = re.compile(r"torch\.(matmul|mm|bmm|addmm|baddbmm|einsum)\b|F\.(linear|conv\w*)\b|"
                                r"nn\.(Linear|Bilinear|Conv\w*)\b|\s@\s")


@dataclass(frozen=True)
class InputFacts:
    """One item of `get_inputs()`: shape and dtype for a tensor (None otherwise), and the range of
    its values over the probed draws (floats only)."""

    shape: tuple[int, ...] | None
    dtype: str | None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class ProblemProbe:
    """Shortcuts that pass `allclose(atol=rtol=tolerance)` on every probed draw of the problem's own
    inputs, and facts about its model. A missing fact is None (or empty); `note` says why."""

    tolerance: float
    inputs: tuple[InputFacts, ...] = ()
    output_shape: tuple[int, ...] | None = None  # None: the forward does not return one tensor
    output_dtype: str | None = None
    identity_input: int | None = None  # the output equals this input
    constant: float | None = None  # the output stays near this one value
    row_fill: str | None = None  # rows are independent, and all but ROW_FRACTION of them can be guessed so
    constant_parameters: tuple[str, ...] = ()  # float parameters of >= 2 elements, all one value when built
    linear_algebra: bool = False  # a matmul or convolution runs (TF32 would apply on a GPU)
    notes: tuple[str, ...] = field(default_factory=tuple)


def probe_problem(problem: Problem, device: str = "cpu", tolerance: float = 1e-2) -> ProblemProbe:
    """The probe of `problem` on `device`. Never raises for the problem's own failures: a problem
    whose code fails gives a probe without shortcuts, with the reason in `notes`."""
    try:
        with rng_isolated(), torch.no_grad():
            return _probe(problem, torch.device(device), tolerance)
    except Exception as exc:  # the problem's own code; its evaluation reports it properly
        return ProblemProbe(tolerance, linear_algebra=bool(_LINEAR_ALGEBRA_RE.search(problem.code)),
                            notes=(f"the problem could not be probed: {type(exc).__name__}: {str(exc)[:200]}",))
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def _probe(problem: Problem, device: torch.device, tolerance: float) -> ProblemProbe:
    module = instantiate_problem(problem)
    set_seed(KERNELBENCH_SEED)
    init = list(module.get_init_inputs())
    set_seed(KERNELBENCH_SEED)
    model = module.Model(*init)
    model = model.to(device) if isinstance(model, torch.nn.Module) else model
    shortcuts = _Shortcuts(tolerance)
    facts: list[InputFacts] = []
    for seed in kernelbench_trial_seeds(KERNELBENCH_SEED, PROBE_TRIALS):
        set_seed(seed)
        inputs = to_device(list(module.get_inputs()), device)
        outputs = flatten_outputs(model(*inputs))
        facts = _merge_facts(facts, inputs)
        shortcuts.observe(model, inputs, outputs)
    return ProblemProbe(
        tolerance, tuple(facts), shortcuts.shape, shortcuts.dtype, shortcuts.identity, shortcuts.constant,
        shortcuts.row_fill, _constant_parameters(model), bool(_LINEAR_ALGEBRA_RE.search(problem.code)) or
        _has_linear_algebra(model), tuple(shortcuts.notes))


def _merge_facts(facts: list[InputFacts], inputs: Sequence[Any]) -> list[InputFacts]:
    """Each input's facts, its value range widened by this draw."""
    merged = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            merged.append(InputFacts(None, None))
            continue
        low = high = None
        if x.is_floating_point() and x.numel():
            low, high = float(x.min()), float(x.max())
            if i < len(facts) and facts[i].low is not None:
                low, high = min(low, facts[i].low), max(high, facts[i].high)  # type: ignore[type-var]
        merged.append(InputFacts(tuple(x.shape), str(x.dtype).removeprefix("torch."), low, high))
    return merged


class _Shortcuts:
    """The shortcuts still standing after each draw (one failing draw rules one out for good)."""

    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance
        self.first = True
        self.shape: tuple[int, ...] | None = None
        self.dtype: str | None = None
        self.identity: int | None = None
        self.constant: float | None = None
        self.row_fill: str | None = None
        self.fills: list[str] = []
        self.notes: list[str] = []

    def observe(self, model: Any, inputs: list[Any], outputs: list[torch.Tensor]) -> None:
        if len(outputs) != 1:
            self.notes.append(f"the forward returns {len(outputs)} tensors: shortcuts are sought for one")
            self.first = False
            return
        out = outputs[0]
        if self.first:
            self._start(model, inputs, out)
            self.first = False
        elif self.shape is None:
            return
        self.identity = self.identity if self.identity is not None and self._close(out, inputs[self.identity]) else None
        if self.constant is not None and not self._close(out, torch.full_like(out, self.constant)):
            self.constant = None
        self.fills = [f for f in self.fills if self._close(_guess_rows(out, f), out)]
        self.row_fill = self.fills[0] if self.fills else None

    def _start(self, model: Any, inputs: list[Any], out: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(out.shape), str(out.dtype).removeprefix("torch.")
        same = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.shape == out.shape
                and x.dtype == out.dtype]
        self.identity = same[0] if same else None
        if out.is_floating_point() and out.numel():
            self.constant = float(out.double().mean())
        if _separable(model, inputs, out):
            self.fills = list(ROW_FILLS)

    def _close(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and bool(torch.allclose(a, b, atol=self.tolerance, rtol=self.tolerance))


def rows_computed(n: int) -> int:
    """How many of `n` rows partial work computes (at least one)."""
    return max(1, math.ceil(n * ROW_FRACTION))


def _separable(model: Any, inputs: list[Any], out: torch.Tensor) -> bool:
    """Whether the first rows of the output are the forward of the first rows of the inputs alone
    (every tensor input and the output share their first dimension, at least 4 long)."""
    n = out.shape[0] if out.dim() else 0
    batched = [x for x in inputs if isinstance(x, torch.Tensor) and x.dim()]
    if n < 4 or not batched or any(x.shape[0] != n for x in batched):
        return False
    k = rows_computed(n)
    try:
        head = flatten_outputs(model(*[x[:k] if isinstance(x, torch.Tensor) and x.dim() else x for x in inputs]))
    except Exception:  # a model that needs the whole batch
        return False
    return (len(head) == 1 and head[0].shape == out[:k].shape
            and bool(torch.allclose(head[0], out[:k], atol=SEPARABLE_TOLERANCE, rtol=SEPARABLE_TOLERANCE)))


def _guess_rows(out: torch.Tensor, fill: str) -> torch.Tensor:
    """`out` with all rows past the computed ones replaced by `fill`'s guess from the computed ones."""
    k = rows_computed(out.shape[0])
    head, rest = out[:k], out.shape[0] - k
    if fill == "mean":
        guess = head.mean(0, keepdim=True).expand(rest, *head.shape[1:])
    elif fill == "tile":
        guess = head.repeat(math.ceil(rest / k), *([1] * (head.dim() - 1)))[:rest]
    else:
        guess = torch.zeros((rest, *head.shape[1:]), dtype=out.dtype, device=out.device)
    return torch.cat([head, guess])


def _constant_parameters(model: Any) -> tuple[str, ...]:
    """Floating parameters of two elements or more that hold one value when the model is built
    (LayerNorm's and GroupNorm's affine, zeroed biases): what a hack may assume stays so."""
    if not isinstance(model, torch.nn.Module):
        return ()
    return tuple(name for name, p in model.named_parameters()
                 if p.is_floating_point() and p.numel() >= 2 and bool((p == p.reshape(-1)[0]).all()))


def _has_linear_algebra(model: Any) -> bool:
    kinds = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.modules.conv._ConvNd)
    return isinstance(model, torch.nn.Module) and any(isinstance(m, kinds) for m in model.modules())
