"""Step 1 of the verified protocol: prepare a problem once, for every candidate of it.

    prepare_trials    per distribution, as one pass that shares its reference calls: the variant
                      chosen on the distribution's first hidden trial (the accepted call is that
                      trial's baseline call), its truth, the soundness screen on it while its tensors
                      are at hand, then the distribution's other trials; each trial then keeps what the
                      memory plan allows (`kbv.memory_plan`)
    drop_distributions  what the soundness screen (`kbv.detect.soundness`) found judges nothing
    prepare_timing    the timing pool (fresh inputs from every applicable distribution), fresh input
                      sets for probes, and the baseline children holding the pool, warmed up

The result is one `PreparedProblem`; its `ledger` counts every reference call preparation made, by
purpose, distribution and precision (`kbv.ledger`). The problem's source runs once
(`instantiate_problem`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kbv.compare import ErrorMeasure, measure_error
from kbv.detect.soundness import Screen, ScreenTally
from kbv.distributions import DISTRIBUTIONS as DISTRIBUTIONS_ORDER
from kbv.distributions import Calibration, choose_variant, draw_inputs, pinned_variants, trial_seed
from kbv.footprint import Footprint
from kbv.inputs import tensor_bytes
from kbv.errors import ProblemRunError, UnsoundProblemError
from kbv.ledger import CallLedger
from kbv.memory_plan import Hold, VerifiedPlan, return_cached
from kbv.problems import Problem, instantiate_problem, problem_code
from kbv.protocols.verified.rules import BASELINES, DRAW_CONSTANT_PARAMETERS, KEEP_BUDGET_BYTES, VerifiedProtocol
from kbv.protocols.verified.timer import TimerConfig, TimingPool, load_pool, pool_size
from kbv.reference import Evaluation, Reference
from kbv.sandbox import ChildFailure, Sandbox
from kbv.sandbox.spares import reference_child
from kbv.settings import Settings, parent_work
from kbv.stages import stage
from kbv.verdict import MemoryStats

Made = tuple[list[Any], dict[str, torch.Tensor], Evaluation]


class TrialData:
    """One hidden trial: its inputs and weights (drawn from its seeds) and the reference's evaluation
    of them (the float64 truth, the baseline's outputs and errors), made on first use.

    What it keeps between candidates is its `hold` (`kbv.memory_plan.Hold`), applied at `release()`:
    everything (ALL, small problems); the evaluation's truth and errors alone (TRUTH: the inputs and
    weights are remade from the seeds when asked for, a draw and a build without a reference call,
    and the baseline's outputs give way to their shapes), its truth on `truth_home` (the host's
    memory, for a GPU short of room) and copied to the trial's device while a candidate is judged; or
    nothing (NONE: remade, reference calls and all, for each candidate).

    `bf16`, when given, makes the reference's own error in bfloat16 on the trial from its inputs and
    truth (`Reference.bf16_errors`); `bf16_err()` asks for it."""

    def __init__(self, distribution: str, index: int, weight_seed: int, make: Callable[[], Made],
                 keep: bool = True, bf16: Callable[[list[Any], list[torch.Tensor]], list[ErrorMeasure] | None] | None = None,
                 draw: Callable[[], list[Any]] | None = None,
                 build_state: Callable[[], dict[str, torch.Tensor]] | None = None) -> None:
        self.distribution = distribution
        self.index = index
        self.weight_seed = weight_seed
        self.hold = Hold.ALL if keep else Hold.NONE
        self.truth_home: torch.device | None = None  # where a TRUTH hold keeps the truth (None: where made)
        self._make = make
        self._draw = draw
        self._build_state = build_state
        self._inputs: list[Any] | None = None
        self._state: dict[str, torch.Tensor] | None = None
        self._ev: Evaluation | None = None
        self._ev_here: Evaluation | None = None  # the evaluation with its truth on the trial's device
        self._bf16 = bf16
        self._bf16_err: list[ErrorMeasure] | None = None
        self._bf16_asked = False

    @property
    def keep(self) -> bool:
        return self.hold is Hold.ALL

    @keep.setter
    def keep(self, value: bool) -> None:
        self.hold = Hold.ALL if value else Hold.NONE

    def fill(self, made: Made) -> None:
        """The trial as made elsewhere (calibration made its first trial's baseline call)."""
        self._inputs, self._state, self._ev = made
        self._ev_here = None

    def _get(self) -> None:
        with parent_work():  # kbv's own work, never charged to a candidate's timeout
            self.fill(self._make())

    @property
    def made(self) -> bool:
        """Whether its evaluation is at hand (made, or held)."""
        return self._ev is not None

    @property
    def inputs(self) -> list[Any]:
        if self._inputs is None:
            self._inputs = self._remade(self._draw)
        return self._inputs if self._inputs is not None else self._made(0)

    def drawn_inputs(self) -> list[Any]:
        """Its inputs without its evaluation: held ones, else a draw (no reference call)."""
        if self._inputs is not None:
            return self._inputs
        return self._draw() if self._draw is not None else self.inputs

    @property
    def state(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            self._state = self._remade(self._build_state)
        return self._state if self._state is not None else self._made(1)

    def _remade(self, remake: Callable[[], Any] | None) -> Any:
        """A part remade from the seeds (a draw, a build: no reference call) where the evaluation is
        held; None where it is not (the whole trial is made then)."""
        if self._ev is None or remake is None:
            return None
        with parent_work():
            return remake()

    def _made(self, part: int) -> Any:
        """Part `part` (0 inputs, 1 state) of the trial, made whole now."""
        self._get()
        return (self._inputs, self._state)[part]

    @property
    def evaluation(self) -> Evaluation:
        if self._ev is None:
            self._get()
        assert self._ev is not None
        if self.truth_home is None or self._ev_here is not None:
            return self._ev_here or self._ev
        device = next((x.device for x in self.drawn_inputs() if isinstance(x, torch.Tensor)), self.truth_home)
        if all(t.device == device for t in self._ev.truth):
            return self._ev
        self._ev_here = replace(self._ev, truth=[t.to(device) for t in self._ev.truth])
        return self._ev_here

    def bf16_err(self) -> list[ErrorMeasure] | None:
        """The reference's own error in bfloat16 on this trial (same inputs, same weights), per output;
        None where it cannot run in bfloat16, or for a trial made without `bf16` (a probe's). Made on
        first ask, which only a failing trial makes (most pass; preparation is much of a lane's time),
        and kept past `release()`: the trial is remade the same from its seeds."""
        if not self._bf16_asked:
            with parent_work():
                self._bf16_err = self._bf16(self.inputs, self.evaluation.truth) if self._bf16 is not None else None
            self._bf16_asked = True
        return self._bf16_err

    @property
    def label(self) -> str:
        return f"{self.distribution} trial {self.index}"

    def footprint_bytes(self) -> int:
        ev = self.evaluation
        return tensor_bytes([*self.inputs, *self.state.values(), *ev.truth, *ev.baseline])

    def settle(self, hold: Hold, truth_home: torch.device | None = None) -> None:
        """Keep `hold` from now on (truth on `truth_home`, for TRUTH), and let go of the rest now."""
        self.hold = hold
        self.truth_home = truth_home if hold is Hold.TRUTH else None
        self.release()

    def release(self) -> None:
        """Let go of what the trial's hold does not keep."""
        if self.hold is Hold.ALL:
            return
        self._inputs, self._state, self._ev_here = None, None, None
        if self.hold is Hold.NONE or self._ev is None:
            self._ev = None
            return
        ev = self._ev
        home = self.truth_home
        truth = [t.to(home) if home is not None and t.device != home else t for t in ev.truth]
        self._ev = replace(ev, truth=truth, baseline=_like(ev.baseline))


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
    screen: Screen | None = None  # what the screen found while the trials were made (None: not screened)
    screen_sensitive: bool = False  # ... with the per-input sensitivity test (`kbv problems check`)
    plan: VerifiedPlan | None = None  # how its memory is held (None: its footprint is unknown)
    host_hold: HostHoldCosts = field(default_factory=lambda: HostHoldCosts())  # a plan's truth in host memory, or made again
    keep_all: bool | None = None  # without a plan: whether every trial is kept (decided on the first made)
    preparation: dict[str, Any] = field(default_factory=dict)  # what preparing it cost (calls, seconds, memory)
    # timing (prepare_timing)
    # timing input sets (device tensors): held, or drawn again from their seeds (`plan.pool_held`)
    pool: TimingPool | list[list[Any]] = field(default_factory=list)
    pool_distributions: list[str] = field(default_factory=list)
    output_like: list[torch.Tensor] = field(default_factory=list)  # the outputs' shapes and dtypes (meta)
    timing_weights: str = ""  # which trial's weights the timed models hold
    baselines: dict[str, Sandbox] = field(default_factory=dict)
    baseline_memory: MemoryStats | None = None
    stack: ExitStack = field(default_factory=ExitStack)
    _truth_memo: dict[int, Evaluation] = field(default_factory=dict)
    recheck_calls: int = 0  # the reference calls the timer's rechecks made (of `ledger.total`)

    @property
    def ledger(self) -> CallLedger:
        return self.reference.ledger

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
        """The reference evaluation of pool entry `index`, for the timer's rechecks: as many kept as the
        memory plan holds trials' truth (one at a time where it holds none: they can be GBs each)."""
        if index not in self._truth_memo:
            if len(self._truth_memo) >= self._pool_truths():
                self._truth_memo.clear()
            dist = self.pool_distributions[index] if self.pool_distributions else "-"
            made = self.ledger.total
            with parent_work(), self.ledger.doing("recheck", dist):
                ev = self.evaluate(self.pool[index])
            self.recheck_calls += self.ledger.total - made
            self._truth_memo[index] = replace(ev, baseline=_like(ev.baseline))
        return self._truth_memo[index]

    def _pool_truths(self) -> int:
        if self.plan is None:
            return 1 if not all(t.keep for t in self.trials) else len(self.pool)
        return len(self.pool) if self.plan.hold is Hold.ALL else 1

    def close(self) -> None:
        """Close the baseline children and drop every tensor now, whoever still holds the record."""
        self.stack.close()
        self._truth_memo.clear()
        self.reference.release_builds()
        self.pool.clear()
        for t in self.trials:
            t.keep = False
            t.release()


def prepare_trials(problem: Problem, protocol: VerifiedProtocol, device: torch.device, secret: bytes,
                   calibration: Calibration | None = None, plan: VerifiedPlan | None = None,
                   footprint: Footprint | None = None, screen: Screen | None = None,
                   ledger: CallLedger | None = None, sensitivity: bool = False) -> PreparedProblem:
    """Lay out the hidden trials and make them, a distribution at a time (see the module docstring):
    the variants chosen on each distribution's first trial unless a `calibration` this problem, secret
    and device had is given; the soundness screen run on them unless its findings (`screen`) are
    given; each trial then keeps what `plan` allows (without a plan: all, where they fit
    KEEP_BUDGET_BYTES). `footprint` (`kbv.footprint`), where known, spares the calls that decide
    whether TF32 matters on a forward that runs no operator it changes.

    Raises ProblemRunError (PreparationTimeout past the ledger's deadline), and UnsoundProblemError
    where no distribution applies."""
    module = instantiate_problem(problem)
    with problem_code(problem.origin, "get_init_inputs"):
        init_inputs = list(module.get_init_inputs())
    ledger = ledger if ledger is not None else CallLedger(problem=problem.origin)
    if device.type == "cuda" and ledger.synchronize is None:  # a purpose's kernels count as its own
        ledger.synchronize = torch.cuda.current_stream(device).synchronize  # the queue its calls go to
    reference = Reference(module, init_inputs, device, protocol.precision, problem.origin,
                          draw_constants=DRAW_CONSTANT_PARAMETERS, ledger=ledger,
                          ops=frozenset(footprint.ops) if footprint is not None else None)
    prepared = PreparedProblem(problem, module, init_inputs, calibration or Calibration({}, {}), [], reference,
                               secret, plan=plan, screen=screen, screen_sensitive=sensitivity and screen is None)
    tally = ScreenTally(protocol, sensitivity) if screen is None else None
    pins = pinned_variants(module, problem.origin) if calibration is None else {}
    per = protocol.trials_per_distribution
    total = len(DISTRIBUTIONS_ORDER) * per if calibration is None else len(prepared.calibration.applicable()) * per
    made = 0
    for dist in DISTRIBUTIONS_ORDER:
        if calibration is None:
            with ledger.doing("trial", dist, step=f"calibration ({dist})"):
                first = _calibrated_first(prepared, dist, pins, device)
            if first is None:
                continue
        elif not prepared.calibration.variants.get(dist):
            continue
        else:
            first = _trial(prepared, dist, 0, device)
        trials = [first] + [_trial(prepared, dist, i, device) for i in range(1, per)]
        made = _make(prepared, trials, dist, made, total, tally)
        prepared.trials += trials
    if not prepared.trials:
        why = "; ".join(f"{d}: {n.removeprefix('not applicable: ')}" for d, n in prepared.calibration.notes.items())
        raise UnsoundProblemError(f"{problem.origin}: no input distribution applies ({why})")
    if tally is not None:
        prepared.screen = tally.result()
    return prepared


def _make(prepared: PreparedProblem, trials: list[TrialData], dist: str, made: int, total: int,
          tally: ScreenTally | None) -> int:
    """Make one distribution's trials, screening the first while its tensors are at hand (it needs
    the second's inputs only), each settled as the plan says once it is made (`total`: how many
    trials the problem will have at most)."""
    ledger = prepared.ledger
    for k, trial in enumerate(trials):
        fresh, t = not trial.made, time.perf_counter()  # a calibrated first trial comes made
        with ledger.doing("trial", dist, step=f"truth {made + 1}/{total} ({dist})"):
            ev = trial.evaluation  # made now, while the step is on the heartbeat
        if fresh:
            if prepared.reference.device.type == "cuda":
                torch.cuda.synchronize(prepared.reference.device)  # its calls' kernels done: their time counted
            prepared.host_hold.made(time.perf_counter() - t)
        prepared.output_like = prepared.output_like or _like(ev.baseline)
        del ev
        made += 1
        if k == 0 and tally is not None:
            with ledger.doing("screen", dist, step=f"screen ({dist})"):
                tally.add(prepared, trials)
        held = sum(1 for t in prepared.trials + trials[:k] if t.hold is not Hold.NONE)
        with ledger.doing("hold", dist):
            _settle(prepared, trial, held, total, trials[:k])
    return made


def _settle(prepared: PreparedProblem, trial: TrialData, held: int, total: int, siblings: list[TrialData]) -> None:
    """What `trial` keeps, `held` trials already keeping something: the plan's hold while the plan
    holds more; without a plan (an unknown footprint), everything where `total` trials' tensors fit
    KEEP_BUDGET_BYTES as the first one's do, else nothing."""
    plan = prepared.plan
    if plan is None:
        if prepared.keep_all is None:
            budget = KEEP_BUDGET_BYTES.get(prepared.reference.device.type, 1 << 30)
            prepared.keep_all = trial.footprint_bytes() * total <= budget
        trial.settle(Hold.ALL if prepared.keep_all else Hold.NONE)
        return
    hold = plan.hold if held < plan.held else Hold.NONE
    if hold is not Hold.TRUTH or plan.truth_home != "host":
        trial.settle(hold)
        return
    costs = prepared.host_hold
    if not costs.remake:
        t = time.perf_counter()
        trial.settle(Hold.TRUTH, torch.device("cpu"))
        costs.moved(time.perf_counter() - t)
        if not costs.remake:
            return
    # made again for each candidate: this trial, and those already in host memory, whose moves back
    # would cost as much again for each candidate (`siblings`: the distribution's made before it)
    for kept in prepared.trials + siblings + [trial]:
        if kept is trial or kept.truth_home is not None:
            kept.settle(Hold.NONE)


@dataclass
class HostHoldCosts:
    """Whether a trial's truth is cheaper to keep in host memory or to make again. A truth kept there
    is moved there once and back to the device for each candidate; one not kept is made again for each
    candidate (a reference call in float64). Where a move takes longer than making the trial (KernelBench's
    L1/9 on an H100: 4 GiB of float64 truth, moved in 4.6 s, made in 0.2 s; 47 of its 50 s of
    preparation went to moving ten of them), the trials' truth is made again instead (`remake`), the
    ones already moved included. Decided on the medians of what was measured, both at hand."""

    make_s: list[float] = field(default_factory=list)
    move_s: list[float] = field(default_factory=list)
    remake: bool = False

    def made(self, seconds: float) -> None:
        self.make_s.append(seconds)
        self._decide()

    def moved(self, seconds: float) -> None:
        self.move_s.append(seconds)
        self._decide()

    def _decide(self) -> None:
        if self.make_s and self.move_s:
            self.remake = statistics.median(self.move_s) > statistics.median(self.make_s)

    def record(self) -> dict[str, Any]:
        """What the evidence says of it (nothing where no truth went to host memory)."""
        if not self.move_s:
            return {}
        return {"host_truth": "made again for each candidate" if self.remake else "kept in host memory",
                "host_move_s": round(statistics.median(self.move_s), 4),
                "trial_make_s": round(statistics.median(self.make_s), 4) if self.make_s else None}


def _calibrated_first(prepared: PreparedProblem, dist: str, pins: dict[str, str | None],
                      device: torch.device) -> TrialData | None:
    """The distribution's first trial, its variant chosen on it: each variant is tried on the trial's
    own inputs and weights, and the accepted call's outputs are the trial's baseline outputs (no call of
    calibration's own). None where no variant applies (recorded in the calibration)."""
    ref, problem, secret = prepared.reference, prepared.problem, prepared.secret
    seed = trial_seed(secret, problem.hash, dist, 0)
    weight_seed = trial_seed(secret, problem.hash, dist, 0, "weights")
    tried: dict[str, Made] = {}
    moved: set[str] = set()  # the variants whose call changed the model's state (BatchNorm in training mode)

    def attempt(variant: Any) -> list[torch.Tensor]:
        tried.clear()  # one variant's tensors at a time: full-size inputs are GBs
        inputs = draw_inputs(prepared.module, variant, seed, device)
        model = ref.build(weight_seed)
        state = _state_of(model)
        with ref.ledger.doing("calibration", dist):
            outputs = ref.baseline_outputs(model, inputs)
        if _changed_state(state, model):
            moved.add(variant.name)
        tried[variant.name] = (inputs, state, Evaluation([], outputs, [], True))
        return outputs

    name, note = choose_variant(dist, pins, attempt)
    prepared.calibration.variants[dist] = name
    if note:
        prepared.calibration.notes[dist] = note
    if name is None:
        return None
    trial = _trial(prepared, dist, 0, device)
    if name in tried:  # the accepted call: the trial's baseline; the rest of its evaluation is made now
        inputs, state, partial = tried.pop(name)
        ref.ledger.counts[("calibration", dist, ref.policy)] -= 1  # it was the trial's own baseline call
        ref.ledger.counts[("baseline", dist, ref.policy)] += 1
        trial.fill((inputs, state, _complete(prepared, trial, inputs, partial.baseline, name in moved)))
    return trial


def _complete(prepared: PreparedProblem, trial: TrialData, inputs: list[Any], baseline: list[torch.Tensor],
              moved: bool) -> Evaluation:
    """The evaluation of a trial whose baseline outputs are made (by a call that changed the model's
    state where `moved`): its truth, errors and state changes. The calls made here may leave the state
    as built (the truth runs on a copy; a convolution on CUDA asks no strict call), so the baseline's
    own call says whether the state moves."""
    ref = prepared.reference
    model = ref.build(trial.weight_seed)
    state = _state_of(model)
    truth, exact = ref.truth(model, inputs)
    errors = [measure_error(t, b) for t, b in zip(truth, baseline)]
    ev = ref.evaluation(model, inputs, truth, exact, baseline, errors)
    if moved or _changed_state(state, model):  # one call from the state built, as the candidate's first is
        ev.changes = ref.state_changes(ref.build(trial.weight_seed), inputs)
    return ev


def _like(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs' shapes and dtypes, as meta tensors (no memory)."""
    return [torch.empty(o.shape, dtype=o.dtype, device="meta") for o in outputs]


def _state_of(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()} if isinstance(model, torch.nn.Module) else {}


def _trial(prepared: PreparedProblem, dist: str, index: int, device: torch.device) -> TrialData:
    ref, problem, secret = prepared.reference, prepared.problem, prepared.secret
    seed = trial_seed(secret, problem.hash, dist, index)
    weight_seed = trial_seed(secret, problem.hash, dist, index, "weights")

    def draw() -> list[Any]:
        return draw_inputs(prepared.module, prepared.calibration.variant(dist), seed, device)

    def build_state() -> dict[str, torch.Tensor]:
        return _state_of(ref.build(weight_seed))

    def make() -> Made:
        with ref.ledger.doing("trial", dist):
            inputs = draw()
            model = ref.build(weight_seed)
            state = _state_of(model)
            ev = ref.evaluate(model, inputs)
            if _changed_state(state, model):  # one call from the state built, as the candidate's first is
                ev.changes = ref.state_changes(ref.build(weight_seed), inputs)
        return inputs, state, ev

    def bf16(inputs: list[Any], truth: list[torch.Tensor]) -> list[ErrorMeasure] | None:
        with ref.ledger.doing("bf16", dist):
            return ref.bf16_errors(ref.build(weight_seed), inputs, truth)  # the weights the truth had

    return TrialData(dist, index, weight_seed, make, bf16=bf16, draw=draw, build_state=build_state)


def _changed_state(before: dict[str, torch.Tensor], model: Any) -> tuple[str, ...]:
    """The state_dict keys whose values `model`'s calls changed since `before` was taken."""
    from kbv.sandbox.integrity import changed

    if not before or not isinstance(model, torch.nn.Module):
        return ()
    after = model.state_dict()
    keys = [k for k in before if k in after]
    return tuple(keys[i] for i in changed([before[k] for k in keys], [after[k] for k in keys]))


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
    if prepared.plan is not None:  # the memory plan's share for the pool
        timer = replace(timer, pool_budget_bytes=min(timer.pool_budget_bytes, prepared.plan.pool_budget_bytes))
    n = pool_size(per_set, settings.l2_bytes, timer, len(dists))
    held = prepared.plan is None or prepared.plan.pool_held
    prepared.pool = TimingPool(n, lambda k: prepared.draw(k, "timing", device), held, first)
    del first
    prepared.pool_distributions = [dists[k % len(dists)] for k in range(n)]
    last = prepared.trials[-1]
    prepared.timing_weights = f"the weights of the {last.label}"
    if not prepared.output_like:  # the trials' outputs gave it when they were made; else one call here
        model = prepared.reference.build(prepared.timing_model_seed)
        prepared.output_like = _like(prepared.reference.baseline_outputs(model, prepared.pool[0]))
    return_cached(device.type)  # the trials', the screen's and the pool's transients: not beside the baselines' copies
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
