"""The trusted reference, evaluated in the parent: float64 truth, the precision-policy baseline output,
and the scale-invariant errors of the latter. Shared by the verified protocol and `problems check`."""

from __future__ import annotations

import copy
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kbv.compare import ErrorMeasure, measure_error
from kbv.inputs import flatten_outputs, rng_isolated, set_seed
from kbv.precision import precision_policy


@dataclass
class Evaluation:
    """The reference at one input set (device tensors)."""

    truth: list[torch.Tensor]  # float64, or strict fp32 where float64 is unsupported
    baseline: list[torch.Tensor]  # the model in its own dtype under the protocol's precision policy
    baseline_err: list[ErrorMeasure]
    exact: bool  # truth came from float64


class Reference:
    """`Model` of a problem, rebuilt per weight seed, evaluated as truth and as the baseline."""

    def __init__(self, module: types.ModuleType, init_inputs: Sequence[Any], device: torch.device,
                 policy: str) -> None:
        self.module = module
        self.init_inputs = list(init_inputs)
        self.device = device
        self.policy = policy

    def build(self, weight_seed: int) -> Any:
        with rng_isolated():
            set_seed(weight_seed)
            model = self.module.Model(*self.init_inputs)
        return model.to(self.device) if isinstance(model, torch.nn.Module) else model

    def baseline_outputs(self, model: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
        with precision_policy(self.policy), torch.no_grad():
            return [o.detach().clone() for o in flatten_outputs(model(*inputs))]

    def evaluate(self, model: Any, inputs: Sequence[Any]) -> Evaluation:
        truth, exact = self.truth(model, inputs)
        baseline = self.baseline_outputs(model, inputs)
        errors = [measure_error(t, b) for t, b in zip(truth, baseline)]
        return Evaluation(truth, baseline, errors, exact)

    def truth(self, model: Any, inputs: Sequence[Any]) -> tuple[list[torch.Tensor], bool]:
        """float64 outputs; strict fp32 where the model cannot run in float64."""
        try:
            model64 = copy.deepcopy(model).double() if isinstance(model, torch.nn.Module) else model
            inputs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            with precision_policy("fp32"), torch.no_grad():
                outs = [o.detach().double() for o in flatten_outputs(model64(*inputs64))]
            return outs, True
        except (RuntimeError, NotImplementedError, TypeError):
            with precision_policy("fp32"), torch.no_grad():
                return [o.detach().double() for o in flatten_outputs(model(*inputs))], False
