"""Step 1 of the verified protocol: prepare a problem once, for every candidate of it.

    prepare_trials    calibrate the distributions; the hidden trials (inputs and weights from
                      secret seeds, float64 truth, the baseline's own output and error), made on demand
    drop_distributions  what the soundness screen (`kbv.detect.soundness`) found judges nothing
    prepare_timing    the timing pool (fresh inputs from every applicable distribution), fresh input
                      sets for probes, and the baseline children holding the pool, warmed up

The result is one `PreparedProblem`. The problem's source runs once (`instantiate_problem`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.compare import ErrorMeasure
from kbv.distributions import Calibration, calibrate, draw_inputs, trial_seed
from kbv.inputs import tensor_bytes
from kbv.errors import ProblemRunError, UnsoundProblemError
from kbv.problems import Problem, instantiate_problem, problem_code
from kbv.protocols.verified.rules import BASELINES, DRAW_CONSTANT_PARAMETERS, KEEP_BUDGET_BYTES, VerifiedProtocol
from kbv.protocols.verified.timer import TimerConfig, load_pool, pool_size
from kbv.reference import Evaluation, Reference
from kbv.sandbox import ChildFailure, Sandbox
from kbv.sandbox.spares import reference_child
from kbv.settings import Settings
from kbv.stages import stage
from kbv.verdict import MemoryStats


class TrialData:
    """One hidden trial. Its inputs, weights and reference evaluation are made on first use; a trial
    that is not `kept` (big problems) drops them again at `release()`, to be remade for the next
    candidate: holding every trial of a multi-GB problem would not fit on the device.

    `bf16`, when given, makes the reference's own error in bfloat16 on the trial from its inputs and
    truth (`Reference.bf16_errors`); `bf16_err()` asks for it."""

    def __init__(self, distribution: str, index: int, weight_seed: int,
                 make: Callable[[], tuple[list[Any], dict[str, torch.Tensor], Evaluation]], keep: bool = True,
                 bf16: Callable[[list[Any], list[torch.Tensor]], list[ErrorMeasure] | None] | None = None) -> None:
        self.distribution = distribution
        self.index = index
        self.weight_seed = weight_seed
        self.keep = keep
        self._make = make
        self._data: tuple[list[Any], dict[str, torch.Tensor], Evaluation] | None = None
        self._bf16 = bf16
        self._bf16_err: list[ErrorMeasure] | None = None
        self._bf16_asked = False

    def _get(self) -> tuple[list[Any], dict[str, torch.Tensor], Evaluation]:
        if self._data is None:
            self._data = self._make()
        return self._data

    @property
    def inputs(self) -> list[Any]:
        return self._get()[0]

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self._get()[1]

    @property
    def evaluation(self) -> Evaluation:
        return self._get()[2]

    def bf16_err(self) -> list[ErrorMeasure] | None:
        """The reference's own error in bfloat16 on this trial (same inputs, same weights), per output;
        None where it cannot run in bfloat16, or for a trial made without `bf16` (a probe's). Made on
        first ask, which only a failing trial makes (most pass; preparation is much of a lane's time),
        and kept past `release()`: the trial is remade the same from its seeds."""
        if not self._bf16_asked:
            self._bf16_err = self._bf16(self.inputs, self.evaluation.truth) if self._bf16 is not None else None
            self._bf16_asked = True
        return self._bf16_err

    @property
    def label(self) -> str:
        return f"{self.distribution} trial {self.index}"

    def footprint_bytes(self) -> int:
        inputs, state, ev = self._get()
        return tensor_bytes([*inputs, *state.values(), *ev.truth, *ev.baseline])

    def release(self) -> None:
        if not self.keep:
            self._data = None


@dataclass
class PreparedProblem:
    """Everything about one problem that every candidate of it is judged against (parent side)."""

    problem: Problem
    module: Any
    init_inputs: list[Any]
    calibration: Calibration
    trials: list[TrialData]
    reference: Reference
    secret: bytes
    flags: tuple[str, ...] = ()
    screen_notes: tuple[str, ...] = ()
    unjudgeable: tuple[str, ...] = ()  # flags under which no verdict means anything (see `screen`)
    # timing (prepare_timing)
    pool: list[list[Any]] = field(default_factory=list)  # timing input sets (device tensors)
    pool_distributions: list[str] = field(default_factory=list)
    output_like: list[torch.Tensor] = field(default_factory=list)  # the outputs' shapes and dtypes (meta)
    timing_weights: str = ""  # which trial's weights the timed models hold
    baselines: dict[str, Sandbox] = field(default_factory=dict)
    baseline_memory: MemoryStats | None = None
    stack: ExitStack = field(default_factory=ExitStack)
    _truth_memo: dict[int, Evaluation] = field(default_factory=dict)

    @property
    def timing_model_seed(self) -> int:
        return self.trials[-1].weight_seed

    def draw(self, k: int, purpose: str, device: torch.device) -> list[Any]:
        """Input set `k` for `purpose` ("timing", "replay"...), round-robin over the applicable distributions."""
        dists = self.calibration.applicable()
        dist = dists[k % len(dists)]
        seed = trial_seed(self.secret, self.problem.hash, f"{purpose}/{dist}", k)
        return draw_inputs(self.module, self.calibration.variant(dist), seed, device)

    def evaluate(self, inputs: list[Any]) -> Evaluation:
        """The reference at `inputs` with the timed models' weights."""
        model = self.reference.build(self.timing_model_seed)
        return self.reference.evaluate(model, inputs)

    def pool_truth(self, index: int) -> Evaluation:
        """The reference evaluation of pool entry `index` (one kept at a time: they can be GBs each)."""
        if index not in self._truth_memo:
            self._truth_memo.clear()
            self._truth_memo[index] = self.evaluate(self.pool[index])
        return self._truth_memo[index]

    def close(self) -> None:
        """Close the baseline children and drop every tensor now, whoever still holds the record."""
        self.stack.close()
        self._truth_memo.clear()
        self.pool.clear()
        for t in self.trials:
            t.keep = False
            t.release()


def prepare_trials(problem: Problem, protocol: VerifiedProtocol, device: torch.device, secret: bytes,
                   calibration: Calibration | None = None) -> PreparedProblem:
    """Calibrate (unless a `calibration` this problem, secret and device had is given) and lay out the
    hidden trials (made on demand). Raises ProblemRunError, and UnsoundProblemError where no
    distribution applies."""
    module = instantiate_problem(problem)
    with problem_code(problem.origin, "get_init_inputs"):
        init_inputs = list(module.get_init_inputs())
    reference = Reference(module, init_inputs, device, protocol.precision, problem.origin,
                          draw_constants=DRAW_CONSTANT_PARAMETERS)
    if calibration is None:
        calib_model = reference.build(trial_seed(secret, problem.hash, "calibration", 0, "weights"))
        calibration = calibrate(module, problem.origin, lambda x: reference.baseline_outputs(calib_model, x), device)
        del calib_model
    trials = [_trial(reference, module, problem, secret, dist, i, calibration, device)
              for dist in calibration.applicable() for i in range(protocol.trials_per_distribution)]
    if not trials:
        why = "; ".join(f"{d}: {n.removeprefix('not applicable: ')}" for d, n in calibration.notes.items())
        raise UnsoundProblemError(f"{problem.origin}: no input distribution applies ({why})")
    _keep_if_small(trials, device)
    return PreparedProblem(problem, module, init_inputs, calibration, trials, reference, secret)


def _trial(reference: Reference, module: Any, problem: Problem, secret: bytes,
           dist: str, index: int, calibration: Calibration, device: torch.device) -> TrialData:
    seed = trial_seed(secret, problem.hash, dist, index)
    weight_seed = trial_seed(secret, problem.hash, dist, index, "weights")

    def make() -> tuple[list[Any], dict[str, torch.Tensor], Evaluation]:
        inputs = draw_inputs(module, calibration.variant(dist), seed, device)
        model = reference.build(weight_seed)
        state = ({k: v.detach().clone() for k, v in model.state_dict().items()}
                 if isinstance(model, torch.nn.Module) else {})
        ev = reference.evaluate(model, inputs)
        if _changed_state(state, model):  # one call from the state built, as the candidate's first is
            ev.changes = reference.state_changes(reference.build(weight_seed), inputs)
        return inputs, state, ev

    def bf16(inputs: list[Any], truth: list[torch.Tensor]) -> list[ErrorMeasure] | None:
        return reference.bf16_errors(reference.build(weight_seed), inputs, truth)  # the weights the truth had

    return TrialData(dist, index, weight_seed, make, bf16=bf16)


def _changed_state(before: dict[str, torch.Tensor], model: Any) -> tuple[str, ...]:
    """The state_dict keys whose values `model`'s calls changed since `before` was taken."""
    from kbv.sandbox.integrity import changed

    if not before or not isinstance(model, torch.nn.Module):
        return ()
    after = model.state_dict()
    keys = [k for k in before if k in after]
    return tuple(keys[i] for i in changed([before[k] for k in keys], [after[k] for k in keys]))


def _keep_if_small(trials: list[TrialData], device: torch.device) -> None:
    """Keep every trial's tensors between candidates when they all fit the budget; else remake them."""
    total = trials[0].footprint_bytes() * len(trials)
    keep = total <= KEEP_BUDGET_BYTES.get(device.type, 1 << 30)
    for t in trials:
        t.keep = keep
        t.release()


def drop_distributions(prepared: PreparedProblem, why: dict[str, str]) -> None:
    """Make the distributions of `why` not applicable, as calibration does, with their trials."""
    for dist, reason in why.items():
        prepared.calibration.variants[dist] = None
        prepared.calibration.notes[dist] = "not applicable: " + reason
    prepared.trials = [t for t in prepared.trials if t.distribution not in why]


@dataclass(frozen=True)
class UnsoundProblem:
    """A problem no candidate of which the verified protocol can judge: `reason` says why (no input
    distribution applies, a nondeterministic reference). It stands in for the `PreparedProblem`:
    every candidate of it gets an `unsound_problem` verdict, stored like any other, with no speedup."""

    reason: str
    flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    calibration: dict[str, str | None] = field(default_factory=dict)
    calibration_notes: dict[str, str] = field(default_factory=dict)

    def close(self) -> None:
        """Nothing is held."""


def spawn_baselines(problem: Problem, names: tuple[str, ...], settings: Settings) -> tuple[ExitStack, dict[str, Sandbox]]:
    """Start one baseline child per name now (their interpreters and torch come up while the parent
    prepares the trials); `prepare_timing` brings them up the rest of the way. The stack closes them."""
    stack = ExitStack()
    children = {}
    try:
        for name in names:  # spares of the lane's where it keeps them (`kbv.sandbox.spares`)
            children[name] = reference_child(settings, f"baseline-{name}-{problem.hash[:10]}", stack)
    except BaseException:
        stack.close()
        raise
    return stack, children


def prepare_timing(prepared: PreparedProblem, protocol: VerifiedProtocol, timer: TimerConfig, settings: Settings,
                   children: dict[str, Sandbox]) -> None:
    """The timing pool, then the (spawned) baseline children loaded with the reference, holding the
    pool, warmed up. Raises ProblemRunError when a baseline fails."""
    device = torch.device(settings.device)
    dists = prepared.calibration.applicable()
    first = prepared.draw(0, "timing", device)
    per_set = tensor_bytes(first)
    n = pool_size(per_set, settings.l2_bytes, timer, len(dists))
    prepared.pool = [first] + [prepared.draw(k, "timing", device) for k in range(1, n)]
    prepared.pool_distributions = [dists[k % len(dists)] for k in range(n)]
    last = prepared.trials[-1]
    prepared.timing_weights = f"the weights of the {last.label}"
    model = prepared.reference.build(prepared.timing_model_seed)
    prepared.output_like = [torch.empty(o.shape, dtype=o.dtype, device="meta")
                            for o in prepared.reference.baseline_outputs(model, prepared.pool[0])]
    try:
        primary = protocol.primary_baseline if protocol.primary_baseline in children else next(iter(children))
        for name, sb in children.items():
            prepared.baselines[name] = _baseline_child(prepared, sb, name, primary, timer, settings)
    except ChildFailure as failure:
        prepared.close()
        raise ProblemRunError(f"{prepared.problem.origin}: the baseline failed: {failure.message}") from failure


def _baseline_child(prepared: PreparedProblem, sb: Sandbox, name: str, primary: str, timer: TimerConfig,
                    settings: Settings) -> Sandbox:
    policy, compiled = BASELINES[name]
    timeout = settings.timeout_s
    sb.ready(timeout)
    sb.call({"op": "load", "source": "reference", "code": prepared.problem.code, "origin": prepared.problem.origin,
             "init_args": prepared.init_inputs, "seed": prepared.timing_model_seed, "precision": policy,
             "compile": compiled, "draw_constants": DRAW_CONSTANT_PARAMETERS}, timeout)
    load_pool(sb, prepared.pool, settings.flush_bytes(timer.flush_factor), timeout)
    if name == primary:  # before anything is timed: the driver-level watch stops then (see sandbox.devicewatch)
        with stage("memory"):
            prepared.baseline_memory = memory_stats(sb.call({"op": "memory"}, timeout))
    # as a candidate's child stands once its attribution profiled it (CUPTI attached): here, where it
    # costs the preparation, not the first candidate's timing
    sb.call({"op": "warmup", "ms": timer.warmup_ms, "profiled": True}, timeout)
    return sb


def memory_stats(reply: dict[str, Any]) -> MemoryStats:
    """A child's `memory` reply as the record."""
    fields = ("peak_bytes", "retained_bytes", "device_peak_bytes", "device_raw_bytes")
    return MemoryStats(**{k: reply.get(k) for k in fields})  # type: ignore[arg-type]
