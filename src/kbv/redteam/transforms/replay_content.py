"""Result replay keyed by a sample of the inputs' values, wherever they live."""

from kbv.redteam.replay import ReplayContent

TRANSFORMATION = ReplayContent()
