"""Result replay keyed by the inputs' addresses (with four sampled values against reused addresses)."""

from kbv.redteam.replay import ReplayPointer

TRANSFORMATION = ReplayPointer()
