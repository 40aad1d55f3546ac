"""Default initialisation assumed (catalogue B10): parameters that a model builds as one constant
(LayerNorm's and GroupNorm's affine as 1 and 0, zeroed biases) are taken to stay so: every call runs
the honest forward with those parameters at the values they were built with, whatever was loaded
since. Under KernelBench's default init that is the same function; with other weights it is not."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

WRAPPER = '''
import torch.func


class ModelNew(_KbvHonest):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["_kbv_built"] = {
            name: p.detach().reshape(-1)[0].item() for name, p in self.named_parameters()
            if p.is_floating_point() and p.numel() >= 2 and bool((p == p.reshape(-1)[0]).all())}
        self.__dict__["_kbv_inside"] = False

    def forward(self, *args, **kwargs):
        if self._kbv_inside or not self._kbv_built:
            return super().forward(*args, **kwargs)
        assumed = {name: torch.full_like(self.get_parameter(name), value) for name, value in self._kbv_built.items()}
        self.__dict__["_kbv_inside"] = True
        try:
            return torch.func.functional_call(self, assumed, args, kwargs, strict=False)
        finally:
            self.__dict__["_kbv_inside"] = False
'''


class DefaultInit(Transformation):
    name = "default_init"
    breaks = Breaks.TRUTH
    summary = "computes with every constant-built parameter (norm affine, zero bias) at its built value"

    def rewrite(self, target: Target) -> str | NotApplicable:
        if not target.probe.constant_parameters:
            return self.not_applicable("the problem's model builds no parameter as one constant")
        return wrap(target.honest.code, self.name, self.summary, WRAPPER)


TRANSFORMATION = DefaultInit()
