"""The verified protocol's correctness: hidden distributions, float64 truth, calibrated tolerance,
integrity checks, result-cache probes.

Per problem (`prepare_verified`, in the parent): calibrate the distributions; for each applicable
distribution draw `trials_per_distribution` input sets and weight sets from secret seeds; evaluate
the reference as float64 truth and as the TF32 baseline (whose own error sets the tolerance); screen
the problem for soundness (`kbv.soundness`).

Per candidate (`check_candidate`, through a sandbox child): for every trial, load the trial's weights,
run twice on identical inputs over differently poisoned memory (integrity evidence from the first
run), compare with the truth; then probe for caches by changing input values in place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kbv.compare import ErrorMeasure, Tolerance, allowed_error, measure_error, within
from kbv.distributions import (
    DISTRIBUTIONS,
    Calibration,
    calibrate,
    draw_inputs,
    is_continuous,
    trial_seed,
)
from kbv.errors import ProblemRunError
from kbv.evidence import guard_evidence, integrity_evidence
from kbv.problems import Problem, instantiate_problem
from kbv.reference import Evaluation, Reference
from kbv.sandbox import Sandbox, SharedArena
from kbv.settings import time_left
from kbv.verdict import Category, Trial

SENTINEL = -7.3e37  # the second run's poison: a value no honest kernel writes
PRECISION_LOSS_BELOW = 1e-2  # a failing error under this is precision lost, not a wrong function


@dataclass(frozen=True)
class VerifiedProtocol:
    """The verified protocol's rules (correctness part). All factors are documented protocol data."""

    trials_per_distribution: int = 2
    tolerance: Tolerance = field(default_factory=Tolerance)
    precision: str = "tf32"  # the baseline's (and the candidate's) float32 policy: tf32 | fp32
    reuse_probes: int = 3  # same-pointer, new-value probes against result caches
    min_custom_share: float = 0.0  # least share of device time in the candidate's own kernels
    name: str = "verified"

    @property
    def version(self) -> str:
        return f"kbv-verified-1.0+{self.precision}"

    @property
    def primary_baseline(self) -> str:
        return f"eager-{self.precision}"

    def fingerprint(self) -> str:
        from dataclasses import asdict

        from kbv.protocols import _fingerprint

        return _fingerprint(asdict(self))


class TrialData:
    """One hidden trial. Its inputs, weights and reference evaluation are made on first use; a trial
    that is not `kept` (big problems) drops them again at `release()`, to be remade for the next
    candidate: holding every trial of a multi-GB problem would not fit on the device."""

    def __init__(self, distribution: str, index: int, weight_seed: int,
                 make: Callable[[], tuple[list[Any], dict[str, torch.Tensor], Evaluation]], keep: bool = True,
                 ) -> None:
        self.distribution = distribution
        self.index = index
        self.weight_seed = weight_seed
        self.keep = keep
        self._make = make
        self._data: tuple[list[Any], dict[str, torch.Tensor], Evaluation] | None = None

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

    def footprint_bytes(self) -> int:
        inputs, state, ev = self._get()
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + list(state.values()) + ev.truth + ev.baseline
        return sum(t.numel() * t.element_size() for t in tensors)

    def release(self) -> None:
        if not self.keep:
            self._data = None


@dataclass
class VerifiedContext:
    problem: Problem
    init_inputs: list[Any]
    calibration: Calibration
    trials: list[TrialData]
    reference: Reference
    flags: tuple[str, ...] = ()
    screen_notes: tuple[str, ...] = ()
    secret: bytes = b""


def prepare_verified(problem: Problem, protocol: VerifiedProtocol, device: torch.device,
                     secret: bytes, sound_check: bool = True) -> VerifiedContext:
    """Calibrate, draw the hidden trials and evaluate the reference on them. Raises ProblemRunError."""
    from kbv.soundness import screen_trials

    module = instantiate_problem(problem)
    try:
        init_inputs = list(module.get_init_inputs())
        reference = Reference(module, init_inputs, device, protocol.precision)
        calib_model = reference.build(trial_seed(secret, problem.hash, "calibration", 0, "weights"))
        calibration = calibrate(module, problem.origin, lambda x: reference.baseline_outputs(calib_model, x), device)
        trials = [_trial(reference, module, problem, secret, dist, i, calibration, device)
                  for dist in calibration.applicable() for i in range(protocol.trials_per_distribution)]
        _keep_if_small(trials, device)
    except (ValueError, RuntimeError, TypeError, IndexError) as exc:
        raise ProblemRunError(f"{problem.origin}: the problem's own code failed under the verified protocol: "
                              f"{type(exc).__name__}: {exc}") from exc
    if not trials:
        raise ProblemRunError(f"{problem.origin}: no distribution is applicable: {calibration.notes}")
    ctx = VerifiedContext(problem, init_inputs, calibration, trials, reference, secret=secret)
    if sound_check:
        flags, notes = screen_trials(ctx, protocol)
        ctx.flags, ctx.screen_notes = tuple(flags), tuple(notes)
    return ctx


KEEP_BUDGET_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}


def _trial(reference: Reference, module: Any, problem: Problem, secret: bytes,
           dist: str, index: int, calibration: Calibration, device: torch.device) -> TrialData:
    seed = trial_seed(secret, problem.hash, dist, index)
    weight_seed = trial_seed(secret, problem.hash, dist, index, "weights")

    def make() -> tuple[list[Any], dict[str, torch.Tensor], Evaluation]:
        inputs = draw_inputs(module, calibration.variant(dist), seed, device)
        model = reference.build(weight_seed)
        state = ({k: v.detach().clone() for k, v in model.state_dict().items()}
                 if isinstance(model, torch.nn.Module) else {})
        return inputs, state, reference.evaluate(model, inputs)

    return TrialData(dist, index, weight_seed, make)


def _keep_if_small(trials: list[TrialData], device: torch.device) -> None:
    """Keep every trial's tensors between candidates when they all fit the budget; else remake them."""
    total = trials[0].footprint_bytes() * len(trials) if trials else 0
    keep = total <= KEEP_BUDGET_BYTES.get(device.type, 1 << 30)
    for t in trials:
        t.keep = keep
        t.release()


# -- one candidate ------------------------------------------------------------------------------

@dataclass
class CorrectnessResult:
    trials: list[Trial]
    categories: list[Category]
    integrity: dict[str, Any]  # category value -> evidence
    state_loaded: bool | None
    notes: list[str]
    hacks: dict[str, str] = field(default_factory=dict)  # category value -> evidence (runtime guards)

    @property
    def passed(self) -> bool:
        return not self.categories


def check_candidate(sb: Sandbox, arena: SharedArena, ctx: VerifiedContext, protocol: VerifiedProtocol,
                    load: dict[str, Any], deadline: float) -> CorrectnessResult:
    """Every trial through the child `sb`; `load` is the child's load command minus seed and state.
    Raises ChildFailure when the candidate crashes, raises or hangs."""
    result = CorrectnessResult([], [], {}, None, [])
    fingerprints: list[tuple[tuple[int, int], bool]] = []
    loaded_seed = None
    late_probed = False
    for trial in ctx.trials:
        # a model with weights is rebuilt for every trial (new weights); one without is built once,
        # so state a candidate keeps across calls (counters, caches) lives through every trial
        if loaded_seed is None or (trial.state and loaded_seed != trial.weight_seed):
            reply = sb.call({**load, "seed": trial.weight_seed, "state_dict": _share_state(arena, trial.state)},
                            time_left(deadline))
            result.state_loaded = bool(reply.get("state_loaded")) if trial.state else None
            loaded_seed = trial.weight_seed
        outcome = _run_trial(sb, arena, trial, protocol, deadline, result)
        fingerprints.append(outcome)
        if outcome[1] and not late_probed and _on_gpu(trial.inputs):
            _late_input_probe(sb, arena, trial, protocol, deadline, result)
            late_probed = True
        if trial is not ctx.trials[-1]:
            trial.release()
    _result_cache_from_fingerprints(fingerprints, result)
    _constant_output(fingerprints, result)
    if result.passed:
        _reuse_probes(sb, arena, ctx, protocol, deadline, result)
    ctx.trials[-1].release()
    _finish_categories(result)
    return result


def _run_trial(sb: Sandbox, arena: SharedArena, trial: TrialData, protocol: VerifiedProtocol,
               deadline: float, result: CorrectnessResult) -> tuple[tuple[int, int], bool]:
    like = trial.evaluation.baseline
    first = _forward(sb, arena, trial.inputs, like, deadline, poison=float("nan"), checks=True, keep=True)
    second = _forward(sb, arena, trial.inputs, like, deadline, poison=SENTINEL)
    for cat, why in integrity_evidence(first["reply"]).items():
        result.integrity.setdefault(cat, why)
    for cat, why in guard_evidence(first["reply"].get("integrity") or {}).items():
        result.hacks.setdefault(cat, why)
    trial_rec, passed, category = _judge(trial, first["outputs"], first["reply"], protocol)
    if first["outputs"] is not None and second["outputs"] is not None:
        agree = _agree(first["outputs"], second["outputs"], trial.evaluation, protocol)
        if not agree:
            unwritten = any(bool((o == SENTINEL).any()) for o in second["outputs"]) or any(
                bool((torch.isnan(a) & torch.isfinite(t) & torch.isfinite(b.to(a.device))).any())
                for a, b, t in zip(first["outputs"], second["outputs"], trial.evaluation.truth))
            cat = Category.UNWRITTEN_OUTPUT if unwritten else Category.NONDETERMINISTIC
            result.integrity.setdefault(cat.value, f"{trial.distribution} trial {trial.index}: "
                                        "two runs on identical inputs disagree")
    result.trials.append(trial_rec)
    if not passed and category is not None:
        result.categories.append(category)
    fp = _fingerprint(first["outputs"]) if first["outputs"] is not None else (0, 0)
    return fp, passed


def _on_gpu(inputs: list[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


def _late_input_probe(sb: Sandbox, arena: SharedArena, trial: TrialData, protocol: VerifiedProtocol,
                      deadline: float, result: CorrectnessResult) -> None:
    """A passing trial again, its inputs written on the current stream behind a spin (see
    `integrity.write_late`): a kernel on a stream that does not wait for the current one computes
    on poison. The device-wide synchronise of the timer already charges such work; this names it."""
    late = _forward(sb, arena, trial.inputs, trial.evaluation.baseline, deadline, late_inputs=True)
    if late["outputs"] is None:
        return
    ev = trial.evaluation
    if not all(within(measure_error(t, o), allowed_error(e, protocol.tolerance))
               for o, t, e in zip(late["outputs"], ev.truth, ev.baseline_err)):
        result.hacks.setdefault(Category.SIDE_STREAM.value,
                                f"{trial.distribution} trial {trial.index}: with its inputs written on the current "
                                "stream just before the call, the output came out wrong: the work ran on a stream "
                                "that does not wait for the current one")


def _forward(sb: Sandbox, arena: SharedArena, inputs: list[Any], like: list[torch.Tensor], deadline: float,
             poison: float | None = None, checks: bool = False, keep: bool = False,
             reuse: bool = False, late_inputs: bool = False) -> dict[str, Any]:
    """One forward in the child; outputs come back on `like`'s device and dtype (None if not copied)."""
    buffers = [arena.empty(t.shape, t.dtype) for t in like]
    command = {"op": "forward", "inputs": arena.handles(inputs), "outputs": [h for _, h in buffers],
               "poison": poison, "checks": checks, "keep": keep, "reuse": reuse, "late_inputs": late_inputs}
    reply = sb.call(command, time_left(deadline))
    outputs = None
    if reply.get("copied"):
        outputs = [buf.to(t.device) for (buf, _), t in zip(buffers, like)]
    return {"reply": reply, "outputs": outputs}


def _judge(trial: TrialData, outputs: list[torch.Tensor] | None, reply: dict[str, Any],
           protocol: VerifiedProtocol) -> tuple[Trial, bool, Category | None]:
    ev = trial.evaluation
    if outputs is None:
        category, note = _shape_problem(reply, ev.baseline)
        return Trial(trial.distribution, trial.index, False, category=category, note=note), False, category
    worst_c, worst_b, worst_a, ok = None, None, None, True
    for out, truth, base_err in zip(outputs, ev.truth, ev.baseline_err):
        cand = measure_error(truth, out)
        allowed = allowed_error(base_err, protocol.tolerance)
        ok = ok and within(cand, allowed)
        if worst_c is None or cand.worst > worst_c.worst:
            worst_c, worst_b, worst_a = cand, base_err, allowed
    category = None if ok else _failure_category(worst_c)
    note = "" if ok else _failure_note(worst_c, worst_a)
    rec = Trial(trial.distribution, trial.index, ok, max_rel_err=worst_c.elem, candidate_err=worst_c.norm,
                baseline_err=worst_b.norm, allowed_err=worst_a.norm, category=category, note=note)
    return rec, ok, category


def _failure_category(err: ErrorMeasure) -> Category:
    if not err.nan_inf_match:
        return Category.NAN_INF_MISMATCH
    if err.norm < PRECISION_LOSS_BELOW:
        return Category.PRECISION_LOSS
    return Category.VALUE_MISMATCH


def _failure_note(err: ErrorMeasure, allowed: ErrorMeasure) -> str:
    if not err.nan_inf_match:
        return "NaN/Inf where the truth is finite (or the reverse)"
    return (f"error {err.norm:.2e} (normwise) / {err.elem:.2e} (elementwise); "
            f"allowed {allowed.norm:.2e} / {allowed.elem:.2e}")


def _shape_problem(reply: dict[str, Any], like: list[torch.Tensor]) -> tuple[Category, str]:
    if reply.get("count") != len(like):
        return Category.SHAPE_MISMATCH, f"returned {reply.get('count')} outputs, expected {len(like)}"
    for meta, ref in zip(reply["outputs"], like):
        if not meta.get("tensor"):
            return Category.NOT_A_TENSOR, f"returned a {meta.get('type')}, not a tensor"
        if tuple(meta["shape"]) != tuple(ref.shape):
            return Category.SHAPE_MISMATCH, f"shape {tuple(meta['shape'])} != {tuple(ref.shape)}"
        if meta["dtype"] != str(ref.dtype).removeprefix("torch."):
            return Category.DTYPE_MISMATCH, f"dtype {meta['dtype']} != {str(ref.dtype).removeprefix('torch.')}"
        if "copy_error" in meta:
            return Category.NOT_A_TENSOR, f"the output could not be read: {meta['copy_error']}"
    return Category.VALUE_MISMATCH, "the output could not be read"


def _agree(a: list[torch.Tensor], b: list[torch.Tensor], ev: Evaluation, protocol: VerifiedProtocol) -> bool:
    """Two runs on identical inputs agree within the tolerance (bitwise equality not required:
    atomics reorder sums)."""
    for x, y, base_err in zip(a, b, ev.baseline_err):
        ref = x.detach().double()
        if not within(measure_error(ref, y), allowed_error(base_err, protocol.tolerance)):
            return False
    return True


def _fingerprint(outputs: list[torch.Tensor]) -> tuple[int, int]:
    h = hashlib.sha256()
    for o in outputs:
        head = o.detach().contiguous().reshape(-1).view(torch.uint8)[: 1 << 22]  # 4 MiB tell outputs apart
        h.update(head.cpu().numpy().tobytes())
        h.update(str(tuple(o.shape)).encode())
    d = h.digest()
    return int.from_bytes(d[:8], "big"), int.from_bytes(d[8:16], "big")


def _result_cache_from_fingerprints(fps: list[tuple[tuple[int, int], bool]], result: CorrectnessResult) -> None:
    """A failing output identical to an earlier trial's passing output was replayed, not computed."""
    for i, (fp, passed) in enumerate(fps):
        if passed:
            continue
        if any(fp == earlier and ok for earlier, ok in fps[:i]):
            result.categories.append(Category.RESULT_CACHE)
            result.notes.append(f"trial {i} returned the output of an earlier trial with other inputs")
            return


def _constant_output(fps: list[tuple[tuple[int, int], bool]], result: CorrectnessResult) -> None:
    """Identical failing outputs for different inputs: the output ignores its input (a hard-coded
    constant, not lost precision)."""
    failing = [fp for fp, ok in fps if not ok]
    if len(failing) >= 2 and len(set(failing)) == 1 and len(fps) >= 2 and len({fp for fp, _ in fps}) == 1:
        result.categories = [c for c in result.categories if c is not Category.PRECISION_LOSS]
        result.categories.insert(0, Category.VALUE_MISMATCH)
        result.notes.append("the same output for every input: it does not depend on its input")


REUSE_FRACTIONS = (0.001, 0.01, 0.1)  # of the elements rewritten in place by each reuse probe


def _reuse_probes(sb: Sandbox, arena: SharedArena, ctx: VerifiedContext, protocol: VerifiedProtocol,
                  deadline: float, result: CorrectnessResult) -> None:
    """Rewrite a few values of the last trial's inputs in place (same tensors, same pointers) and check.
    A cache keyed on pointers, identities or a sample of values still hits, and returns what it
    stored for the old values; changing few elements keeps sampled keys unchanged with high
    probability, and still moves the true output well past the tolerance."""
    trial = ctx.trials[-1]
    device = next((x.device for x in trial.inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    gen = torch.Generator(device=device).manual_seed(trial_seed(ctx.secret, ctx.problem.hash, "reuse", 0))
    model = ctx.reference.build(trial.weight_seed)
    for probe in range(protocol.reuse_probes):
        fraction = REUSE_FRACTIONS[probe % len(REUSE_FRACTIONS)]
        inputs = [_some_new(x, gen, fraction) if is_continuous(x) else x for x in trial.inputs]
        ev = ctx.reference.evaluate(model, inputs)
        first = _forward(sb, arena, inputs, ev.baseline, deadline, reuse=True)
        probe_trial = TrialData(f"{trial.distribution}/reuse", probe, trial.weight_seed,
                                lambda inputs=inputs, ev=ev: (inputs, {}, ev))
        rec, ok, _ = _judge(probe_trial, first["outputs"], first["reply"], protocol)
        if not ok:
            result.categories.append(Category.RESULT_CACHE)
            result.notes.append(f"new values written into the same input memory gave a stale result ({rec.note})")
            result.trials.append(rec)
            return


def _some_new(x: torch.Tensor, gen: torch.Generator, fraction: float) -> torch.Tensor:
    """`x` with a `fraction` of its elements (at least one) swapped for other elements of `x`, scaled:
    new values of the same distribution at random places."""
    flat = x.reshape(-1).clone()
    n = max(1, int(flat.numel() * fraction))
    where = torch.randperm(flat.numel(), generator=gen, device=x.device)[:n]
    source = torch.randint(0, flat.numel(), (n,), generator=gen, device=x.device)
    flat[where] = flat[source] * 1.5 + (flat[source] == 0).to(flat.dtype)  # keeps the sign: domains hold
    return flat.reshape(x.shape)


def _finish_categories(result: CorrectnessResult) -> None:
    failed_dists = {t.distribution for t in result.trials if not t.passed}
    passed_default = all(t.passed for t in result.trials if t.distribution == "default")
    if failed_dists and passed_default and any(d in DISTRIBUTIONS and d != "default" for d in failed_dists):
        result.categories.append(Category.DISTRIBUTION_FAILURE)
    result.categories = list(dict.fromkeys(result.categories))
    for cat in list(result.integrity) + list(result.hacks):
        result.categories.append(Category(cat))
    result.categories = list(dict.fromkeys(result.categories))


def _share_state(arena: SharedArena, state: dict[str, torch.Tensor]) -> dict[str, Any] | None:
    if not state:
        return None
    return {k: arena.share(v)[1] for k, v in state.items()}


