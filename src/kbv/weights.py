"""Parameters are inputs too: the verified suite draws the parameters a model initialises to a constant.

A problem whose output is constant under its default initialisation judges nothing: GroupNorm's affine
weight and bias start at 1 and 0, so a mean over a group-normalised tensor is mean(bias) = 0 whatever the
input, and a kernel that never reads its input passes. Under each trial's weight seed, every floating
parameter whose elements are all equal (numel > 1: a random initialisation never is) gets values drawn
around its constant, in the reference and the candidate alike. The draw depends only on the seed and on
the parameter's shape, whether its constant is zero, and its rank among the parameters of that kind,
never on its name or its constant's value: a constant c becomes c x (1 + d) for drawn factors d, so a
candidate that builds the same modules under other names draws the same values, one that folds a
factor into a constant (2 x ones where the reference has ones) keeps the factor, and one that
hard-codes the defaults computes another function.

Imported by the parent (`kbv.reference`) and by the child (`kbv.sandbox.child`) before any candidate
code runs: pure torch, no side effects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import torch

# A constant c is drawn as c x (1 + d), d uniform in [-1/2, 1/2]: same sign and scale, never zero, so
# a divisor, a scale or a variance stays one. A zero (a bias) is drawn as d itself: the scale of a
# normalised activation, which such biases are added to.
SPREAD = 0.5


Kind = tuple[tuple[int, ...], bool, int]  # a constant parameter's shape, whether it is zero, its rank among those


def constant_kinds(model: Any) -> tuple[Kind, ...]:
    """The kinds of `model`'s constant-initialised floating parameters (what a draw keys on)."""
    return tuple(kind for _, _, kind, _ in _constant_parameters(model))


def draw_constant_parameters(model: Any, seed: int, only: Collection[Kind] | None = None) -> tuple[str, ...]:
    """Redraw `model`'s constant-initialised floating parameters in place for `seed`; the names of
    those it redrew. With `only` (the reference's `constant_kinds`), only parameters of those kinds: a
    candidate's constant that the reference has no counterpart of (an averaging kernel of 1/27s that
    makes a pooling a convolution) is its own construction, not a parameter of the problem's. A model
    that is not an `nn.Module` is left as it is."""
    drawn = []
    with torch.no_grad():
        for name, p, kind, value in _constant_parameters(model):
            if only is not None and kind not in only:
                continue
            p.copy_(_draw(p.shape, value, _seed(seed, kind)).to(device=p.device, dtype=p.dtype))
            drawn.append(name)
    return tuple(drawn)


def _constant_parameters(model: Any) -> list[tuple[str, torch.Tensor, Kind, float]]:
    """Name, tensor, kind and constant of each constant floating parameter, in the model's order."""
    if not isinstance(model, torch.nn.Module):
        return []
    rank: dict[tuple[tuple[int, ...], bool], int] = {}
    found = []
    for name, p in model.named_parameters():
        value = _constant(p)
        if value is None:
            continue
        shape_zero = (tuple(p.shape), value == 0.0)
        rank[shape_zero] = rank.get(shape_zero, 0) + 1
        found.append((name, p, (*shape_zero, rank[shape_zero]), value))
    return found


def _constant(p: torch.Tensor) -> float | None:
    """The value every element of `p` holds, or None (not floating, a single element, or not constant)."""
    if torch.nn.parameter.is_lazy(p) or not p.is_floating_point() or p.numel() < 2 or p.is_meta:
        return None
    flat = p.detach().reshape(-1)  # (numel,)
    first = flat[0]
    if not bool(torch.isfinite(first)) or not bool((flat == first).all()):
        return None
    return float(first)


def _seed(seed: int, kind: Kind) -> int:
    shape, zero, rank = kind
    text = f"{seed}|{shape}|{zero!r}|{rank}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def _draw(shape: torch.Size, value: float, seed: int) -> torch.Tensor:
    """Values around `value` (float64, on the CPU: the same on every device)."""
    u = torch.rand(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    d = (u - 0.5) * 2 * SPREAD  # uniform in [-SPREAD, SPREAD]
    return d if value == 0.0 else value * (1 + d)
