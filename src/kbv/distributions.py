"""The hidden input suite of the verified protocol: five distributions, secret seeds, calibration.

- `default`: the problem's own `get_inputs()`, reseeded;
- `signed`: zero-mean, sign-mixed (standard normal);
- `large`: magnitudes around 1e3;
- `small`: magnitudes around 1e-3;
- `range`: fp32's dynamic range, beyond fp16's. An fp32 problem promises fp32's range, and fp16's
  10-bit mantissa equals TF32's, so a kernel that narrows its operands or intermediates to fp16 passes
  every tolerance calibrated on a TF32 baseline; only its range gives it away. The first variant draws
  log-uniform magnitudes over [1e-7, 1e6] with random signs: about 9% of the values lie beyond fp16's
  largest finite value (65504), where fp16 gives inf, and about 21% below its smallest normal (6.1e-5),
  where it keeps few bits or none. Then positive-only, then the two ends apart: normal x 1e5 and
  uniform [0.5, 1.5) x 1e5 (overflow only), normal x 1e-6 and uniform x 1e-6 (underflow only).
  The error measure is scale-invariant (relative to the output's rms), so where huge and tiny values
  meet in one output the tiny ones are swamped: the first variant catches overflow everywhere, but
  underflow only where outputs stay on their inputs' scale (normalisations); the tiny-only steps are
  taken only when the wider variants are unusable.
  TODO: an underflow-only trial on problems that take the first variant would need a sixth
  distribution (or per-trial variants); two more trials per problem were not worth it yet.

Only continuous floating-point inputs are redrawn. Integer and boolean inputs, and float inputs that
hold a few distinct values (masks, +-1 targets), keep what the problem's own generator drew for the
same seed. Shapes and dtypes never change. A continuous input with structural zeros (a triangular
matrix, a sparsified one: more than STRUCTURAL_ZEROS of its elements exactly zero, which no continuous
draw makes by chance) keeps them: the redraw changes its values, never the structure the problem
promises (a kernel that skips the zero half of a triangular product is right on every such input).

Calibration picks, per problem and distribution, the first variant on which the reference stays
finite and non-degenerate (e.g. log of negatives steps `signed` to `positive`; exp overflow steps
`large` down to 1e2 and `range` to its tiny end), or marks the distribution not applicable with the
reason. A problem file can pin variants with a module-level dict, e.g. `KBV_DISTRIBUTIONS = {"signed": "positive", "range": "skip"}`.
"""

from __future__ import annotations

import hashlib
import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.inputs import rng_isolated, set_seed, to_device
from kbv.errors import ProblemRunError
from kbv.problems import problem_code

DISTRIBUTIONS = ("default", "signed", "large", "small", "range")
FEW_VALUES = 16  # a float input with at most this many distinct values is categorical
STRUCTURAL_ZEROS = 0.01  # a continuous input with more exact zeros than this share keeps them
CALIBRATION_SEED = 1_234_567


@dataclass(frozen=True)
class Variant:
    name: str
    # "problem" (the problem's own values) | "mixed" (normal) | "positive" (uniform [0.5, 1.5)) |
    # "log-mixed" / "log-positive" (magnitudes log-uniform over [low, scale], random / positive signs)
    sign: str
    scale: float
    low: float = 0.0  # the log-* variants' smallest magnitude


VARIANTS: dict[str, tuple[Variant, ...]] = {
    "default": (Variant("problem", "problem", 1.0),),
    "signed": (Variant("normal", "mixed", 1.0), Variant("normal-0.1", "mixed", 0.1),
               Variant("positive", "positive", 1.0)),
    "large": (Variant("normal-1e3", "mixed", 1e3), Variant("normal-1e2", "mixed", 1e2),
              Variant("positive-1e3", "positive", 1e3), Variant("positive-1e2", "positive", 1e2),
              Variant("normal-10", "mixed", 10.0), Variant("positive-10", "positive", 10.0)),
    "small": (Variant("normal-1e-3", "mixed", 1e-3), Variant("positive-1e-3", "positive", 1e-3),
              Variant("normal-1e-2", "mixed", 1e-2), Variant("positive-1e-2", "positive", 1e-2)),
    "range": (Variant("log-1e-7-1e6", "log-mixed", 1e6, 1e-7),
              Variant("log-positive-1e-7-1e6", "log-positive", 1e6, 1e-7),
              Variant("normal-1e5", "mixed", 1e5), Variant("positive-1e5", "positive", 1e5),
              Variant("normal-1e-6", "mixed", 1e-6), Variant("positive-1e-6", "positive", 1e-6)),
}
FP16_MAX = 65504.0  # fp16's largest finite value: the `range` distribution goes past it ...
FP16_TINY = 2.0 ** -14  # ... and below its smallest normal (6.1e-5)
PIN_ATTRIBUTE = "KBV_DISTRIBUTIONS"


@dataclass(frozen=True)
class Calibration:
    """Per distribution: the variant used (None: not applicable), and why it was chosen or skipped."""

    variants: dict[str, str | None]
    notes: dict[str, str] = field(default_factory=dict)

    def applicable(self) -> list[str]:
        return [d for d in DISTRIBUTIONS if self.variants.get(d)]

    def variant(self, distribution: str) -> Variant:
        name = self.variants[distribution]
        return next(v for v in VARIANTS[distribution] if v.name == name)


def trial_seed(secret: bytes, problem_hash: str, distribution: str, index: int, purpose: str = "inputs") -> int:
    """A 63-bit seed no candidate can predict: derived from the run's secret by a one-way hash."""
    text = f"{problem_hash}|{distribution}|{index}|{purpose}".encode()
    return int.from_bytes(hashlib.sha256(secret + text).digest()[:8], "big") >> 1


def draw_inputs(module: types.ModuleType, variant: Variant, seed: int, device: torch.device) -> list[Any]:
    """One input set of `variant` for `seed`, on `device`. The problem's own generator runs first
    (reseeded) and gives shapes, dtypes and every input that is not redrawn."""
    with rng_isolated():
        set_seed(seed)
        with torch.device(device), problem_code(getattr(module, "__file__", None) or "problem", "get_inputs"):
            base = to_device(module.get_inputs(), device)
        if variant.sign == "problem":
            return base
        gen = torch.Generator(device=device).manual_seed(seed ^ 0x5DEECE66D)
        return [_redraw(x, variant, gen) if is_continuous(x) else x for x in base]


def is_continuous(x: Any) -> bool:
    """A floating-point tensor with more than a few distinct values."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return False
    sample = _sample(x)
    return torch.unique(sample).numel() > min(FEW_VALUES, sample.numel() // 4)


def _sample(x: torch.Tensor, n: int = 65536) -> torch.Tensor:
    """About `n` elements spread evenly over the whole of `x` (not its first rows: a triangular
    matrix's first rows are almost all zeros or almost none)."""
    flat = x.detach().reshape(-1)
    return flat[::max(1, flat.numel() // n)]


def _redraw(x: torch.Tensor, variant: Variant, gen: torch.Generator) -> torch.Tensor:
    if variant.sign.startswith("log-"):
        values = _log_uniform(x, variant, gen)
    elif variant.sign == "mixed":
        values = (torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32) * variant.scale).to(x.dtype)
    else:
        values = ((0.5 + torch.rand(x.shape, generator=gen, device=x.device, dtype=torch.float32))
                  * variant.scale).to(x.dtype)
    if has_structural_zeros(x):
        values.masked_fill_(x == 0, 0.0)  # in place: full-size inputs are GBs
    return values


def has_structural_zeros(x: torch.Tensor) -> bool:
    """More than STRUCTURAL_ZEROS of the elements exactly zero (judged on a sample spread over it)."""
    sample = _sample(x)
    return sample.numel() > 0 and float((sample == 0).float().mean()) > STRUCTURAL_ZEROS


def _log_uniform(x: torch.Tensor, variant: Variant, gen: torch.Generator) -> torch.Tensor:
    """Magnitudes log-uniform over [variant.low, variant.scale]; signs random for "log-mixed"."""
    lo, hi = math.log(variant.low), math.log(variant.scale)
    values = torch.rand(x.shape, generator=gen, device=x.device, dtype=torch.float32)
    values.mul_(hi - lo).add_(lo).exp_()  # in place: full-size inputs are GBs
    if variant.sign == "log-mixed":
        values.mul_(torch.rand(x.shape, generator=gen, device=x.device).lt_(0.5).mul_(-2).add_(1))
    return values.to(x.dtype)


def pinned_variants(module: types.ModuleType, origin: str) -> dict[str, str | None]:
    """The problem's own pins: {distribution: variant name, or None for 'skip'}. Raises ProblemRunError."""
    pins = getattr(module, PIN_ATTRIBUTE, None)
    if pins is None:
        return {}
    if not isinstance(pins, dict):
        raise ProblemRunError(f"{origin}: {PIN_ATTRIBUTE} must be a dict of distribution -> variant name or 'skip'")
    out: dict[str, str | None] = {}
    for dist, name in pins.items():
        if dist not in DISTRIBUTIONS:
            raise ProblemRunError(f"{origin}: {PIN_ATTRIBUTE} names unknown distribution {dist!r}")
        if name == "skip":
            out[dist] = None
        elif name in {v.name for v in VARIANTS[dist]}:
            out[dist] = name
        else:
            names = ", ".join(v.name for v in VARIANTS[dist])
            raise ProblemRunError(f"{origin}: {PIN_ATTRIBUTE}[{dist!r}] = {name!r}; expected 'skip' or one of {names}")
    return out


def calibrate(module: types.ModuleType, origin: str, reference: Callable[[list[Any]], list[torch.Tensor]],
              device: torch.device) -> Calibration:
    """Choose a variant per distribution on which `reference(inputs)` is finite and non-degenerate,
    on inputs drawn from CALIBRATION_SEED. (The verified protocol calibrates on each distribution's
    first hidden trial instead, whose accepted call is that trial's own: `choose_variant`.)"""
    pins = pinned_variants(module, origin)
    variants: dict[str, str | None] = {}
    notes: dict[str, str] = {}
    for dist in DISTRIBUTIONS:
        name, note = choose_variant(dist, pins, lambda v: reference(draw_inputs(module, v, CALIBRATION_SEED, device)))
        variants[dist] = name
        if note:
            notes[dist] = note
    return Calibration(variants, notes)


def choose_variant(dist: str, pins: dict[str, str | None],
                   attempt: Callable[[Variant], Sequence[torch.Tensor]]) -> tuple[str | None, str]:
    """The variant of `dist` to use (None: not applicable) and the note that says why: the problem's
    pin, else the first variant whose reference outputs (`attempt(variant)`) are finite and not
    degenerate."""
    if dist in pins:
        return pins[dist], ("pinned by the problem" if pins[dist] else "skipped by the problem")
    rejected = []
    for variant in VARIANTS[dist]:
        problem = _unhealthy(attempt(variant))
        if problem is None:
            return variant.name, "; ".join(rejected)
        rejected.append(f"{variant.name}: {problem}")
    return None, "not applicable: " + "; ".join(rejected)


def _unhealthy(outputs: Sequence[torch.Tensor]) -> str | None:
    """Why an output set is unusable as truth, or None."""
    for out in outputs:
        if not out.is_floating_point():
            continue
        if not bool(torch.isfinite(out).all()):
            return "reference output not finite"
        peak = float(out.abs().max()) if out.numel() else 0.0
        if peak == 0.0:
            return "reference output all zero"
        if out.numel() > 1 and float(out.max() - out.min()) <= 1e-6 * peak:
            return "reference output constant"
    return None
