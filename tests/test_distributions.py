"""The hidden suite: drawing, calibration, pins, secret seeds."""

from __future__ import annotations

import types

import pytest
import torch

from kbv.distributions import (VARIANTS, calibrate, draw_inputs, is_continuous, pinned_variants, trial_seed)


def _module(source: str) -> types.ModuleType:
    m = types.ModuleType("p")
    exec(source, m.__dict__)
    return m


MIXED = """
import torch
def get_inputs():
    x = torch.rand(64, 32)
    idx = torch.randint(0, 10, (64,))
    mask = (torch.rand(64, 32) > 0.5).float()
    return [x, idx, mask, 3]
def get_init_inputs(): return []
"""


def _variant(dist, name):
    return next(v for v in VARIANTS[dist] if v.name == name)


def test_only_continuous_floats_are_redrawn_and_shapes_dtypes_stay():
    m = _module(MIXED)
    default = draw_inputs(m, VARIANTS["default"][0], 5, torch.device("cpu"))
    large = draw_inputs(m, _variant("large", "normal-1e3"), 5, torch.device("cpu"))
    assert [tuple(t.shape) for t in large[:3]] == [tuple(t.shape) for t in default[:3]]
    assert [t.dtype for t in large[:3]] == [t.dtype for t in default[:3]]
    assert torch.equal(large[1], default[1])  # integers: the problem's own generator
    assert torch.equal(large[2], default[2])  # a 0/1 mask keeps its value set
    assert large[3] == 3
    assert float(large[0].abs().mean()) > 100 and float(large[0].min()) < 0


def test_draws_depend_on_the_seed_only():
    m = _module(MIXED)
    a = draw_inputs(m, _variant("signed", "normal"), 11, torch.device("cpu"))
    b = draw_inputs(m, _variant("signed", "normal"), 11, torch.device("cpu"))
    c = draw_inputs(m, _variant("signed", "normal"), 12, torch.device("cpu"))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_secret_seeds_differ_per_secret_distribution_and_trial():
    s = {trial_seed(b"a", "h", "signed", 0), trial_seed(b"b", "h", "signed", 0),
         trial_seed(b"a", "h", "large", 0), trial_seed(b"a", "h", "signed", 1)}
    assert len(s) == 4
    assert trial_seed(b"a", "h", "signed", 0) == trial_seed(b"a", "h", "signed", 0)


def test_few_valued_detection():
    assert is_continuous(torch.rand(100))
    assert not is_continuous(torch.randint(0, 2, (100,)).float())
    assert not is_continuous(torch.arange(10))


LOG = """
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.log(x)
def get_inputs(): return [torch.rand(32, 32) + 0.1]
def get_init_inputs(): return []
"""
EXP = """
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.exp(x)
def get_inputs(): return [torch.rand(32, 32)]
def get_init_inputs(): return []
"""


def _calibrate(source):
    m = _module(source)
    model = m.Model()
    return calibrate(m, "p.py", lambda xs: [model(*xs)], torch.device("cpu"))


def test_calibration_steps_to_milder_variants_and_says_why():
    log = _calibrate(LOG)
    assert log.variants["signed"] == "positive"
    assert "not finite" in log.notes["signed"]
    exp = _calibrate(EXP)
    assert exp.variants["large"] == "normal-10"  # 1e3 and 1e2 overflow exp
    assert exp.variants["small"] == "normal-1e-3"


def test_a_distribution_where_nothing_works_is_not_applicable():
    const = _module("""
import torch
class Model(torch.nn.Module):
    def forward(self, x): return torch.clamp(x, min=1e9)
def get_inputs(): return [torch.rand(8)]
def get_init_inputs(): return []
""")
    model = const.Model()
    cal = calibrate(const, "c.py", lambda xs: [model(*xs)], torch.device("cpu"))
    assert cal.variants["signed"] is None and "not applicable" in cal.notes["signed"]
    assert cal.applicable() == []


def test_problems_can_pin_variants_and_bad_pins_are_errors():
    m = _module(LOG + '\nKBV_DISTRIBUTIONS = {"large": "positive-1e2", "small": "skip"}\n')
    assert pinned_variants(m, "p.py") == {"large": "positive-1e2", "small": None}
    cal = _calibrate(LOG + '\nKBV_DISTRIBUTIONS = {"large": "positive-1e2", "small": "skip"}\n')
    assert cal.variants["large"] == "positive-1e2" and cal.variants["small"] is None
    with pytest.raises(ValueError, match="unknown distribution"):
        pinned_variants(_module('KBV_DISTRIBUTIONS = {"huge": "skip"}'), "p.py")
    with pytest.raises(ValueError, match="expected 'skip' or one of"):
        pinned_variants(_module('KBV_DISTRIBUTIONS = {"large": "enormous"}'), "p.py")
