"""The trusted reference, evaluated in the parent: float64 truth, the precision-policy baseline output,
and the scale-invariant errors of the latter. Shared by the verified protocol and `problems check`."""

from __future__ import annotations

import contextlib
import copy
import functools
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.compare import ErrorMeasure, Tolerance, measure_error
from kbv.inputs import flatten_outputs, rng_isolated, set_seed
from kbv.ledger import CallLedger
from kbv.precision import precision_policy
from kbv.problems import out_of_memory, problem_code
from kbv.weights import Kind, constant_kinds, draw_constant_parameters


# A module's hooks, by the attribute that holds them (`torch.nn.Module`)
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
          "_load_state_dict_post_hooks")


def model_copy(model: Any) -> Any:
    """A deep copy of `model` that is a model of its own. `copy.deepcopy` rebinds a bound method to
    the copy but shares a function: a hook or an attribute that is a closure, a function with
    defaults, or a `functools.partial` would still call the model it was copied from (KernelBench's
    L3/44_MiniGPTBlock keeps `self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))`: its
    float64 copy ran the float32 MLP, and the truth fell back to fp32). Each such function of the
    copy's modules (as a hook, an attribute, or in a list, tuple or dict attribute) is made again
    with what it holds taken from the copy. Raises what `copy.deepcopy` raises."""
    if not isinstance(model, torch.nn.Module):
        return copy.deepcopy(model)
    memo: dict[int, Any] = {}
    clone = copy.deepcopy(model, memo)
    for module in clone.modules():
        for name in _HOOKS:
            hooks = getattr(module, name, None)
            if isinstance(hooks, dict):
                for key, hook in list(hooks.items()):
                    hooks[key] = _rebound(hook, memo)
        for name, value in list(vars(module).items()):
            if isinstance(value, (list, tuple)):
                items = [_rebound(v, memo) for v in value]
                if any(a is not b for a, b in zip(items, value)):
                    if isinstance(value, list):
                        value[:] = items
                    else:  # a plain tuple or a named one (torch.Size holds no function)
                        module.__dict__[name] = type(value)(*items) if hasattr(value, "_fields") else tuple(items)
            elif isinstance(value, dict) and not name.startswith("_"):
                for key, v in list(value.items()):
                    value[key] = _rebound(v, memo)
            else:
                module.__dict__[name] = _rebound(value, memo)
    return clone


def _rebound(fn: Any, memo: dict[int, Any]) -> Any:
    """`fn` made again over the copy (`memo`: the deep copy's originals to copies), where a deep copy
    shared it: a function with closure cells or defaults, a partial; anything else as it is. A function
    held by another's cells or defaults (a decorator's wrapper) is made again too, each once."""
    if isinstance(fn, functools.partial):
        return functools.partial(_rebound(fn.func, memo), *(_copied(a, memo) for a in fn.args),
                                 **{k: _copied(v, memo) for k, v in fn.keywords.items()})
    if not isinstance(fn, types.FunctionType) or not (fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__):
        return fn
    if id(fn) in memo:  # made already (a function that holds itself, or one held twice)
        return memo[id(fn)]
    cells = tuple(types.CellType() for _ in fn.__closure__) if fn.__closure__ is not None else None
    made = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, None, cells)
    memo[id(fn)] = made
    for new, old in zip(made.__closure__ or (), fn.__closure__ or ()):
        try:
            new.cell_contents = _copied(old.cell_contents, memo)
        except ValueError:  # a cell not yet filled stays empty
            pass
    made.__defaults__ = tuple(_copied(d, memo) for d in fn.__defaults__) if fn.__defaults__ else None
    made.__kwdefaults__ = {k: _copied(v, memo) for k, v in fn.__kwdefaults__.items()} if fn.__kwdefaults__ else None
    made.__qualname__, made.__module__, made.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    made.__dict__.update(fn.__dict__)
    return made


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    """What a function made again holds: a function made again, anything else deep-copied with `memo`."""
    if isinstance(value, (types.FunctionType, functools.partial)):
        return _rebound(value, memo)
    return copy.deepcopy(value, memo)


@dataclass
class Evaluation:
    """The reference at one input set (device tensors)."""

    truth: list[torch.Tensor]  # float64, or strict fp32 where float64 is unsupported
    baseline: list[torch.Tensor]  # the model in its own dtype under the protocol's precision policy
    baseline_err: list[ErrorMeasure]
    exact: bool  # truth came from float64
    # what one call of the reference changes in its state, from the state it was built with: state_dict
    # key -> [shape, sum, sum of squares] after the call (BatchNorm's running statistics in training
    # mode, which KernelBench never leaves): a candidate that changes its state the same way does its job
    changes: dict[str, list[Any]] = field(default_factory=dict)


class Reference:
    """`Model` of a problem, rebuilt per weight seed, evaluated as truth and as the baseline. Every
    forward it makes is counted in `ledger` (`kbv.ledger`). `ops`, the aten operators its forward
    dispatches (`kbv.footprint`, traced on the meta device), where known: a forward that runs no
    operator TF32 changes needs no strict-fp32 call to find out whether TF32 matters."""

    def __init__(self, module: types.ModuleType, init_inputs: Sequence[Any], device: torch.device,
                 policy: str, origin: str = "problem", draw_constants: bool = False,
                 ledger: CallLedger | None = None, ops: frozenset[str] | None = None) -> None:
        self.module = module
        self.init_inputs = list(init_inputs)
        self.device = device
        self.policy = policy
        self.origin = origin  # named when the problem's own code raises (ProblemRunError)
        # draw the parameters the model initialises to a constant, per weight seed (`kbv.weights`)
        self.draw_constants = draw_constants
        self.drawn: tuple[str, ...] = ()  # the parameters the last build drew
        self.kinds: tuple[Kind, ...] = ()  # what they are (`kbv.weights.Kind`): all a candidate may have drawn
        self.ledger = ledger if ledger is not None else CallLedger(problem=origin)
        self.ops = ops
        self._convolves: bool | None = None if ops is None else bool(ops & CONVOLUTIONS)
        self._kept: tuple[int, Any] | None = None  # the last weight seed's model, as built (`build`)

    def build(self, weight_seed: int) -> Any:
        """A fresh model of `weight_seed`'s weights. The last seed's build is kept as built, and a build
        of the same seed again is a copy of it on the device: preparing a problem builds each trial's
        model three times or so (its calibration, its truth, the screen), and a problem's own
        initialisation runs on the host (0.4 s for each of KernelBench's L2/9 builds, 8192 x 8192
        weights). A model that cannot be copied (`model_copy`) is built again."""
        kept = self._kept
        if kept is not None and kept[0] == weight_seed:
            with contextlib.suppress(Exception):  # whatever stops a copy: built again, as it was
                return model_copy(kept[1])
        self._kept = None  # the last seed's build let go before the next is made
        model = self._build(weight_seed)
        try:
            self._kept = (weight_seed, model_copy(model))
        except Exception:  # noqa: BLE001 - a model that cannot be copied is built each time
            self._kept = None
        return model

    def release_builds(self) -> None:
        """Let go of the build kept for its seed's next build (its device memory)."""
        self._kept = None

    def _build(self, weight_seed: int) -> Any:
        with rng_isolated(), problem_code(self.origin, "Model(...)"):
            set_seed(weight_seed)
            model = self.module.Model(*self.init_inputs)
            if not isinstance(model, torch.nn.Module):
                return model
            model = model.to(self.device)
            if self.draw_constants:
                self.kinds = constant_kinds(model)
                self.drawn = draw_constant_parameters(model, weight_seed)
            return model

    def baseline_outputs(self, model: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
        self.ledger.count(self.policy)
        with precision_policy(self.policy), torch.no_grad(), problem_code(self.origin, "forward"):
            return [o.detach().clone() for o in flatten_outputs(model(*inputs))]

    def state_changes(self, model: Any, inputs: Sequence[Any]) -> dict[str, list[Any]]:
        """What one baseline call of `model` on `inputs` changes in its state_dict: key -> [shape, sum,
        sum of squares] after the call (`kbv.sandbox.integrity.state_print`)."""
        from kbv.sandbox.integrity import changed, state_print

        if not isinstance(model, torch.nn.Module):
            return {}
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with self.ledger.doing("state", self.ledger.distribution):
            self.baseline_outputs(model, inputs)
        after = model.state_dict()
        keys = [k for k in before if k in after]
        return {keys[i]: state_print(after[keys[i]]) for i in changed([before[k] for k in keys], [after[k] for k in keys])}

    def evaluate(self, model: Any, inputs: Sequence[Any]) -> Evaluation:
        with problem_code(self.origin, "forward"):
            return self._evaluate(model, inputs)

    def _evaluate(self, model: Any, inputs: Sequence[Any]) -> Evaluation:
        truth, exact = self.truth(model, inputs)
        with self.ledger.doing("baseline", self.ledger.distribution):
            baseline = self.baseline_outputs(model, inputs)
        errors = [measure_error(t, b) for t, b in zip(truth, baseline)]
        return self.evaluation(model, inputs, truth, exact, baseline, errors)

    def evaluation(self, model: Any, inputs: Sequence[Any], truth: list[torch.Tensor], exact: bool,
                   baseline: list[torch.Tensor], errors: list[ErrorMeasure]) -> Evaluation:
        """The record of a call whose truth and baseline outputs are made, the TF32 allowance judged."""
        if self.policy == "tf32" and self._may_use_tf32() and self._tf32_matters(model, inputs, truth, errors):
            # a truncating TF32 kernel errs up to ~60x more than cuBLAS's rounding one on positive
            # data; it is allowed TRUNCATED_FACTOR x its own error (not the 4x of the baseline's),
            # tight enough that bf16 math still fails
            scale = TRUNCATED_FACTOR / Tolerance().factor
            with self.ledger.doing("tf32", self.ledger.distribution):
                truncated = self._truncated_outputs(model, inputs)
            errors = [_worse(e, _scaled(measure_error(t, o), scale)) for e, t, o in zip(errors, truth, truncated)]
        return Evaluation(truth, baseline, errors, exact)

    def truth(self, model: Any, inputs: Sequence[Any]) -> tuple[list[torch.Tensor], bool]:
        """float64 outputs; strict fp32 where the model cannot run in float64."""
        with self.ledger.doing("truth", self.ledger.distribution):
            return self._truth(model, inputs)

    def _truth(self, model: Any, inputs: Sequence[Any]) -> tuple[list[torch.Tensor], bool]:
        self.ledger.count("float64")
        try:
            model64 = model_copy(model).double() if isinstance(model, torch.nn.Module) else model
            inputs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            with precision_policy("fp32"), torch.no_grad():
                outs = [o.detach().double() for o in flatten_outputs(model64(*inputs64))]
            return outs, True
        except (RuntimeError, NotImplementedError, TypeError):
            self.ledger.count("fp32")
            with precision_policy("fp32"), torch.no_grad():
                return [o.detach().double() for o in flatten_outputs(model(*inputs))], False

    def bf16_errors(self, model: Any, inputs: Sequence[Any], truth: list[torch.Tensor]) -> list[ErrorMeasure] | None:
        """What the reference itself errs in bfloat16, per output: `model` (a build of the caller's own,
        cast in place) and the floating
        `inputs` cast to bfloat16, its outputs measured against `truth` (float64) as a candidate's are.
        None where it cannot run in bfloat16 (an op without a bfloat16 kernel, a dtype check in the
        problem's own code): its callers fall back to a rule that needs no such figure."""
        self.ledger.count("bf16")
        try:  # `model` is the caller's own fresh build: cast in place, no second copy on the device
            model16 = model.to(torch.bfloat16) if isinstance(model, torch.nn.Module) else model
            inputs16 = [x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                        for x in inputs]
            with precision_policy("fp32"), torch.no_grad():
                outs = flatten_outputs(model16(*inputs16))
        except Exception as exc:  # whatever stops the problem's code in bfloat16: no figure, never a failed run
            if out_of_memory(exc):  # but never a category that hangs on how full the device is
                raise
            return None
        if len(outs) != len(truth):
            return None
        return [measure_error(t, o.detach().to(t.dtype)) for t, o in zip(truth, outs)]

    def _tf32_matters(self, model: Any, inputs: Sequence[Any], truth: list[torch.Tensor],
                      errors: list[ErrorMeasure]) -> bool:
        """Whether TF32 math is what the baseline's policy allows on this problem: its baseline's
        outputs show TF32 (cuBLAS's fp32 GEMMs under TF32), or it runs a convolution on CUDA, where
        cuDNN picks per algorithm and layout whether TF32 is used. The reference's NCHW convolution
        may get an exact algorithm while a candidate's channels-last one, or one cudnn.benchmark
        picked, gets a TF32 one: both are what the policy allows, so the allowance must not hang on
        the reference's luck (CUDA-L1's L2/6 and L2/7, flagged precision_loss on an H200 at 17x and
        2.7x of an fp32-level allowance, with TF32-level errors)."""
        if self._cudnn_may_pick_tf32() and self._runs_convolution(model, inputs):
            return True
        with self.ledger.doing("tf32", self.ledger.distribution):
            self.ledger.count("fp32")
            with precision_policy("fp32"), torch.no_grad():
                strict = flatten_outputs(model(*inputs))
        return any(e.norm > 8 * measure_error(t, s).norm + 1e-12 for e, t, s in zip(errors, truth, strict))

    def _cudnn_may_pick_tf32(self) -> bool:
        return self.device.type == "cuda"

    def _may_use_tf32(self) -> bool:
        """Whether the forward runs an operator TF32 changes (True where its operators are unknown)."""
        from kbv.footprint import TF32_OPS

        return self.ops is None or bool(self.ops & TF32_OPS)

    def _runs_convolution(self, model: Any, inputs: Sequence[Any]) -> bool:
        """Whether the model's forward runs a convolution (seen once per problem, on a copy: a call
        changes a model's state, BatchNorm's running statistics among it)."""
        if self._convolves is None:
            try:
                self._convolves = runs_ops(model, inputs, CONVOLUTIONS)
            except Exception:  # a model that cannot be copied or traced: its outputs decide, as before
                self._convolves = False
        return self._convolves

    def _truncated_outputs(self, model: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The model on TF32-truncated inputs and weights, in fp32: what a tensor-core kernel that
        truncates (rather than rounds) its operands computes, such as Triton's `tl.dot` in TF32. cuBLAS
        rounds to nearest and errs less; both are TF32, so the allowance covers the worse."""
        self.ledger.count("tf32-truncated")
        clone = model_copy(model) if isinstance(model, torch.nn.Module) else model
        if isinstance(clone, torch.nn.Module):
            with torch.no_grad():
                for p in list(clone.parameters()) + list(clone.buffers()):
                    if p.dtype == torch.float32:
                        p.copy_(truncate_tf32(p))
        cut = [truncate_tf32(x) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x for x in inputs]
        with precision_policy("fp32"), torch.no_grad():
            return [o.detach() for o in flatten_outputs(clone(*cut))]


CONVOLUTIONS = frozenset({"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
                          "convolution_overrideable", "mkldnn_convolution", "conv2d", "conv3d", "conv1d"})


def runs_ops(model: Any, inputs: Sequence[Any], names: frozenset[str]) -> bool:
    """Whether one forward of (a copy of) `model` dispatches an aten operator named in `names`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        found = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.overloadpacket.__name__ in names:
                Seen.found = True
            return func(*args, **(kwargs or {}))

    clone = model_copy(model) if isinstance(model, torch.nn.Module) else model
    with precision_policy("fp32"), torch.no_grad(), Seen():
        clone(*inputs)
    return Seen.found


def truncate_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 with the 13 low mantissa bits cleared: TF32's 10 explicit bits, truncated."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32).view(x.shape)


TRUNCATED_FACTOR = 1.5


def _scaled(e: ErrorMeasure, k: float) -> ErrorMeasure:
    return ErrorMeasure(e.norm * k, e.elem * k, e.nan_inf_match)


def _worse(a: ErrorMeasure, b: ErrorMeasure) -> ErrorMeasure:
    return ErrorMeasure(max(a.norm, b.norm), max(a.elem, b.elem), a.nan_inf_match)
