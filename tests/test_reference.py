"""The trusted reference's builds (kbv.reference.Reference.build): a seed's model built once while it is
the last one built, each later build of it a pristine copy."""

from __future__ import annotations

import threading
import types

import torch

from kbv.reference import Reference

BATCHNORM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.bn = nn.BatchNorm1d(8)
    def forward(self, x):
        return self.bn(self.fc(x))
def get_inputs():
    return [torch.rand(32, 16)]
def get_init_inputs():
    return []
"""


def _reference(source: str) -> tuple[Reference, list[int]]:
    module = types.ModuleType("problem")
    exec(compile(source, "problem.py", "exec"), module.__dict__)
    built: list[int] = []
    cls = module.Model

    class Counted(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object) -> None:
            built.append(1)
            super().__init__(*args)

    module.Model = Counted
    return Reference(module, [], torch.device("cpu"), "fp32"), built


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_seeds_next_build_is_a_pristine_copy_of_its_first() -> None:
    """Preparing a problem builds each trial's model three times or so; its weights are made once. A
    call that moved the first build's state (BatchNorm's running statistics in training mode) does not
    reach the next build of the seed: a candidate's first call is judged from the state as built."""
    ref, built = _reference(BATCHNORM)
    first = ref.build(7)
    pristine = _state(first)
    with torch.no_grad():
        first(torch.rand(32, 16))
    assert not torch.equal(first.bn.running_mean, pristine["bn.running_mean"])
    again = ref.build(7)
    assert again is not first and len(built) == 1
    assert all(torch.equal(v, pristine[k]) for k, v in again.state_dict().items())
    other = ref.build(8)
    assert len(built) == 2 and not torch.equal(other.fc.weight, again.fc.weight)
    ref.build(7)  # no longer the last built: built again, the same weights
    assert len(built) == 3 and torch.equal(ref.build(7).fc.weight, pristine["fc.weight"])
    ref.release_builds()
    ref.build(7)
    assert len(built) == 4


def test_a_model_that_cannot_be_copied_is_built_each_time() -> None:
    ref, built = _reference(BATCHNORM.replace("self.bn = nn.BatchNorm1d(8)",
                                              "self.bn = nn.BatchNorm1d(8)\n        self.lock = __import__('threading').Lock()"))
    a, b = ref.build(3), ref.build(3)
    assert len(built) == 2 and torch.equal(a.fc.weight, b.fc.weight)
    assert isinstance(b.lock, type(threading.Lock()))
