"""Parameters are inputs too (`kbv.weights`): the constant-initialised parameters a model holds are drawn
per seed, the same in the reference and in a candidate built its own way."""

from __future__ import annotations

import torch
import torch.nn as nn

from kbv.weights import constant_kinds, draw_constant_parameters


class Reference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.norm = nn.GroupNorm(4, 16)


class Renamed(nn.Module):
    """The same modules under other names and in its own order of construction."""

    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(4, 16)
        self.fc = nn.Linear(8, 16)


class Folded(nn.Module):
    """A factor of 2 folded into the norm's weight at construction; its bias kept as the reference's."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((16,), 2.0))
        self.shift = nn.Parameter(torch.zeros(16))


def test_constant_parameters_are_drawn_by_seed_and_random_ones_left_alone():
    torch.manual_seed(0)
    model = Reference()
    weight = model.linear.weight.detach().clone()
    assert draw_constant_parameters(model, 7) == ("norm.weight", "norm.bias")
    assert torch.equal(model.linear.weight, weight)  # a random initialisation is no constant
    w, b = model.norm.weight.detach(), model.norm.bias.detach()
    assert bool(((w >= 0.5) & (w <= 1.5)).all()) and w.std() > 0.1
    assert bool(((b >= -0.5) & (b <= 0.5)).all()) and b.std() > 0.1
    again = Reference()
    draw_constant_parameters(again, 7)
    assert torch.equal(again.norm.weight, model.norm.weight)
    other = Reference()
    draw_constant_parameters(other, 8)
    assert not torch.equal(other.norm.weight, model.norm.weight)


def test_a_candidate_built_its_own_way_draws_the_same_values():
    ref, renamed, folded = Reference(), Renamed(), Folded()
    for m in (ref, renamed, folded):
        draw_constant_parameters(m, 11)
    assert torch.equal(renamed.gn.weight, ref.norm.weight) and torch.equal(renamed.gn.bias, ref.norm.bias)
    # the folded factor survives the draw: its scale is still twice the reference's weight
    assert torch.allclose(folded.scale, 2 * ref.norm.weight) and torch.equal(folded.shift, ref.norm.bias)


def test_a_lazy_module_is_left_to_its_first_call():
    model = nn.Sequential(nn.LazyLinear(4), nn.LayerNorm(4))
    assert draw_constant_parameters(model, 3) == ("1.weight", "1.bias")


class PoolAsConv(nn.Module):
    """Its own construction: a 3x3 average pooling as a depthwise convolution with a kernel of ninths,
    beside the reference's norm under other names."""

    def __init__(self) -> None:
        super().__init__()
        self.box = nn.Parameter(torch.full((16, 1, 3, 3), 1 / 9), requires_grad=False)
        self.gn = nn.GroupNorm(4, 16)


def test_a_candidate_draws_only_the_kinds_of_constant_the_reference_drew():
    """A constant the reference has no counterpart of (the ninths that make a pooling a convolution)
    is the candidate's own construction: drawing it changes the function it computes (CUDA-L1's
    L1/46, value_mismatch of 0.29 on every distribution). The norm it shares is drawn as the reference's."""
    ref, cand = Reference(), PoolAsConv()
    kinds = constant_kinds(ref)
    assert kinds == (((16,), False, 1), ((16,), True, 1))
    draw_constant_parameters(ref, 5)
    assert draw_constant_parameters(cand, 5, kinds) == ("gn.weight", "gn.bias")
    assert bool((cand.box == 1 / 9).all())
    assert torch.equal(cand.gn.weight, ref.norm.weight) and torch.equal(cand.gn.bias, ref.norm.bias)
    assert draw_constant_parameters(PoolAsConv(), 5, ()) == ()  # a reference with no constant: nothing drawn
