"""The trusted reference's builds (kbv.reference.Reference.build): a seed's model built once while it is
the last one built, each later build of it a pristine copy."""

from __future__ import annotations

import threading
import types

import pytest
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


HOOKED = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.register_forward_hook(lambda module, args, out: out + self.calls)
    def forward(self, x):
        self.calls += 1
        return x * 2
def get_inputs():
    return [torch.rand(4)]
def get_init_inputs():
    return []
"""


BOUND_HOOK = HOOKED.replace(
    "self.register_forward_hook(lambda module, args, out: out + self.calls)",
    "self.register_forward_hook(self.add_calls)").replace(
    "    def forward(self, x):", "    def add_calls(self, module, args, out):\n        return out + self.calls\n"
                                "    def forward(self, x):")
DEFAULT_HOOK = HOOKED.replace("lambda module, args, out: out + self.calls",
                              "lambda module, args, out, calls=self.calls: out + calls")
WRAPPED_HOOK = HOOKED.replace(
    "self.register_forward_hook(lambda module, args, out: out + self.calls)",
    "add = lambda module, args, out: out + self.calls\n"
    "        self.register_forward_hook(lambda module, args, out: add(module, args, out))")
LISTED_HOOK = HOOKED.replace("self.register_forward_hook(lambda module, args, out: out + self.calls)",
                             "self.adders = [lambda out: out + self.calls]").replace(
    "        return x * 2", "        return self.adders[0](x * 2)")


@pytest.mark.parametrize("source", [HOOKED, BOUND_HOOK, DEFAULT_HOOK, LISTED_HOOK, WRAPPED_HOOK],
                         ids=["closure", "bound-method", "default-argument", "closure-in-a-list",
                              "closure-in-a-closure"])
def test_a_seeds_next_build_is_a_model_of_its_own_whatever_holds_it(source: str) -> None:
    """A build called twice, then the seed built again: the copy adds its own call count (2x + 1), as a
    fresh build does. A plain deep copy rebinds a bound method but shares a function: a closure's, a
    default argument's or a listed closure's copy would add the first build's count (2x + 2)."""
    ref, built = _reference(source)
    x = torch.ones(4)
    first = ref.build(5)
    first(x), first(x)
    again = ref.build(5)
    assert len(built) == 1
    assert torch.equal(again(x), 2 * x + 1)
    assert torch.equal(first(x), 2 * x + 3)  # the first build counts its own calls, untouched by the copy's


MINI_GPT_MLP = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(8, 32), c_proj=nn.Linear(32, 8), act=nn.GELU()))
        m = self.mlp
        self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))
    def forward(self, x):
        return x + self.mlpf(x)
def get_inputs():
    return [torch.rand(4, 8)]
def get_init_inputs():
    return []
"""


def test_a_model_whose_attribute_closes_over_its_layers_gets_a_float64_truth() -> None:
    """KernelBench's L3/44_MiniGPTBlock keeps its MLP as `self.mlpf = lambda x: m.c_proj(...)`: a plain
    deep copy cast to float64 still called the float32 layers, raised, and the truth fell back to fp32.
    The copy's function calls the copy's layers: the truth is float64, and the model is untouched."""
    ref, _ = _reference(MINI_GPT_MLP)
    model = ref.build(3)
    x = torch.rand(4, 8)
    truth, exact = ref.truth(model, [x])
    assert exact and truth[0].dtype == torch.float64
    assert model.mlp.c_fc.weight.dtype == torch.float32
    assert torch.allclose(truth[0].float(), model(x), atol=1e-5)
