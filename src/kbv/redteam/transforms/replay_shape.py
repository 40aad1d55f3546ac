"""Result replay keyed by the inputs' shapes and first values."""

from kbv.redteam.replay import ReplayShape

TRANSFORMATION = ReplayShape()
