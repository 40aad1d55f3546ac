"""Seeded draws (kbv.inputs.rng_isolated): one seeded block at a time in a process, so that a lane's
draws are its seed's, whatever another lane seeds meanwhile."""

from __future__ import annotations

import threading

import torch

from kbv.inputs import rng_isolated, set_seed
from lanes import run_lanes


def _draws(seed: int) -> list[torch.Tensor]:
    with rng_isolated():
        set_seed(seed)
        return [torch.rand(1000), torch.rand(1000)]


def test_a_lanes_draws_are_its_seeds_while_another_lane_seeds_its_own() -> None:
    """A reference's weights drawn in one lane while another lane seeds and draws: the first lane's
    second draw came from the other's seed (KernelBench's L2/22, whose identity the standard protocol
    then failed 0/5 on an H100). The lane's draws are the ones its seed gives alone."""
    alone = _draws(1)
    drawn, first_in, other_seeded, lane_drew = [], threading.Event(), threading.Event(), threading.Event()

    def lane() -> None:
        with rng_isolated():
            set_seed(1)
            drawn.append(torch.rand(1000))
            first_in.set()
            other_seeded.wait(timeout=0.5)  # the other lane would have seeded by now, were it let in
            drawn.append(torch.rand(1000))
        lane_drew.set()

    def other() -> None:
        first_in.wait(timeout=5)
        with rng_isolated():
            set_seed(2)
            other_seeded.set()
            lane_drew.wait(timeout=5)

    run_lanes(lane, other)
    assert len(drawn) == 2 and all(torch.equal(a, b) for a, b in zip(alone, drawn))
    assert not torch.equal(_draws(2)[0], alone[0])
