"""Steps 2 and 3 of the verified protocol: correctness on the hidden trials, then the probes.

`check_correctness`: for every trial, load the trial's weights, run twice on identical inputs over
differently poisoned memory (integrity and guard evidence from the first run), and judge the first
against the truth with the one tolerance check (`kbv.compare.judge_outputs`); then what the
trials' outputs say about caches and constants (`kbv.detect.caches`).

`run_probes` (only after a clean pass): a passing trial again with its inputs written late on the
current stream (side streams, GPU), and the last trial's inputs rewritten in place, a few values at
a time (result caches keyed on pointers, identities or sampled values).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kbv.compare import ErrorMeasure, Judgement, judge_outputs
from kbv.detect.caches import Fingerprint, constant_output, output_fingerprint, replayed_output
from kbv.detect.evidence import (
    guard_evidence,
    integrity_evidence,
    io_bytes,
    overwrite_evidence,
    poison_shown,
    retained_state,
)
from kbv.distributions import DISTRIBUTIONS, has_structural_zeros, is_continuous, trial_seed
from kbv.inputs import tensor_bytes
from kbv.protocols.verified.prepare import PreparedProblem, TrialData
from kbv.protocols.verified.rules import (
    LATE_INPUT_CYCLES,
    PRECISION_LOSS_BELOW,
    PRECISION_LOSS_FACTOR,
    REUSE_FRACTIONS,
    SENTINEL,
    VerifiedProtocol,
)
from kbv.reference import Evaluation
from kbv.sandbox import Sandbox
from kbv.settings import time_left
from kbv.stages import stage
from kbv.verdict import Category, Trial


@dataclass
class CorrectnessResult:
    trials: list[Trial] = field(default_factory=list)
    categories: list[Category] = field(default_factory=list)  # wrong values (and caches seen in outputs)
    integrity: dict[str, str] = field(default_factory=dict)  # category value -> evidence
    hacks: dict[str, str] = field(default_factory=dict)  # category value -> evidence (runtime guards, probes)
    state_loaded: bool | None = None
    notes: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)  # the candidate's load reply (retained state...)

    @property
    def passed(self) -> bool:
        return not self.categories and not self.integrity and not self.hacks

    def all_categories(self) -> list[Category]:
        return list(dict.fromkeys(self.categories + [Category(c) for c in list(self.integrity) + list(self.hacks)]))


def check_correctness(sb: Sandbox, prepared: PreparedProblem, protocol: VerifiedProtocol, load: dict[str, Any],
                      deadline: float) -> CorrectnessResult:
    """Every trial through the started child `sb`; `load` is its load command without seed and state.
    Raises ChildFailure when the candidate crashes, raises or hangs.

    The candidate is built under each trial's weight seed, as the reference is, and the reference's
    weights are loaded into it where names and shapes agree. A candidate whose own weights differed
    from them (it made them its own way at construction: pre-scaled by a constant, folded, re-laid
    out) and whose values then fail is judged again as built under the same seeds, without the load:
    the values it computes from its own weights are what it claims, and loading the reference's
    under its names had undone its own construction."""
    result, differed = _trials(sb, prepared, protocol, load, deadline, loads_state=True)
    if differed and result.categories:
        own, _ = _trials(sb, prepared, protocol, load, deadline, loads_state=False)
        if not own.categories:
            own.notes.append("its weights differ from the reference's under the same seed (made its own way at "
                             "construction); with the reference's loaded into it, it failed (" + _first_failure(result)
                             + "): judged as built under each trial's seed instead")
            return own
    return result


def _trials(sb: Sandbox, prepared: PreparedProblem, protocol: VerifiedProtocol, load: dict[str, Any],
            deadline: float, loads_state: bool) -> tuple[CorrectnessResult, bool]:
    """The trials, with the reference's weights loaded into the candidate (`loads_state`) or not; also
    whether its own weights differed from the reference's before a load."""
    result = CorrectnessResult()
    prints: list[tuple[Fingerprint | None, bool]] = []
    loaded_seed = None
    differed = False
    for trial in prepared.trials:
        # a model with weights is rebuilt for every trial (new weights); one without is built once,
        # so state a candidate keeps across calls (counters, caches) lives through every trial
        if loaded_seed is None or (trial.state and loaded_seed != trial.weight_seed):
            state = _put_state(sb, trial.state, deadline) if loads_state else None
            with stage("load"):
                reply = sb.call({**load, "seed": trial.weight_seed, "state_dict": state}, time_left(deadline))
            if not result.load:
                result.load = reply
                _retained(reply, trial, result)
            result.state_loaded = bool(reply.get("state_loaded")) if trial.state else None
            differed = differed or bool(reply.get("state_differs"))
            loaded_seed = trial.weight_seed
        prints.append(_run_trial(sb, trial, protocol, deadline, result))
        if trial is not prepared.trials[-1]:
            trial.release()
    for found in (replayed_output(prints), constant_output(prints)):
        if found is not None:
            if found[0] is Category.VALUE_MISMATCH:  # a constant: not lost precision
                result.categories = [c for c in result.categories if c is not Category.PRECISION_LOSS]
                result.categories.insert(0, found[0])
            else:
                result.categories.append(found[0])
            result.notes.append(found[1])
    _distribution_failure(result)
    return result, differed


def _first_failure(result: CorrectnessResult) -> str:
    failed = next((t for t in result.trials if not t.passed), None)
    what = ", ".join(c.value for c in result.categories)
    return f"{what} ({failed.distribution} trial {failed.index})" if failed is not None else what


def _run_trial(sb: Sandbox, trial: TrialData, protocol: VerifiedProtocol, deadline: float,
               result: CorrectnessResult) -> tuple[Fingerprint | None, bool]:
    """One trial: two runs over differently poisoned memory, the first judged. Returns the first
    run's fingerprint (None when it delivered no output, or one the poison shows in: no output of
    the kernel's own for the cache and constant rules to compare) and whether the trial passed."""
    ev = trial.evaluation
    first = forward(sb, trial.inputs, ev.baseline, deadline, poison=float("nan"), checks=True, keep=True)
    second = forward(sb, trial.inputs, ev.baseline, deadline, poison=SENTINEL)
    # the reference's names are its state_dict's (no KernelBench reference has a buffer outside it):
    # a tensor of the candidate's under any other is its own
    for cat, why in integrity_evidence(first.reply, ev.changes, trial.state.keys()).items():
        result.integrity.setdefault(cat, why)
    for cat, why in guard_evidence(first.reply.get("integrity") or {}).items():
        result.hacks.setdefault(cat, why)
    overwritten = overwrite_evidence(second.reply)  # the second run wrote into the first run's output
    if overwritten:
        result.integrity.setdefault(Category.ALIASES_PARAMETER.value, f"{trial.label}: {overwritten}")
    record, category = judge_trial(trial, first, protocol)
    shown = None
    if first.outputs is not None and second.outputs is not None and not _agree(first.outputs, second.outputs, ev,
                                                                               protocol):
        shown = poison_shown(first.outputs, second.outputs, ev.truth)
        if shown is None:  # no poison in sight: the kernel itself answers differently (races, atomics)
            result.integrity.setdefault(Category.NONDETERMINISTIC.value,
                                        f"{trial.label}: two runs on identical inputs disagree")
        else:
            record, category = _judge_written(trial, first.outputs, shown, protocol)
            result.integrity.setdefault(Category.UNWRITTEN_OUTPUT.value,
                                        f"{trial.label}: two runs on identical inputs disagree where the "
                                        f"poison shows ({_poison_count(shown)})")
    result.trials.append(record)
    if category is not None:
        result.categories.append(category)
    delivered = first.outputs is not None and shown is None
    return (output_fingerprint(first.outputs) if delivered else None), record.passed


def _judge_written(trial: TrialData, outputs: list[torch.Tensor], shown: list[torch.Tensor],
                   protocol: VerifiedProtocol) -> tuple[Trial, Category | None]:
    """The trial judged on what the kernel wrote: the truth stands in where the poison shows (`shown`),
    whose values are the harness's, not the kernel's. What still fails is the kernel's own wrong
    value; otherwise the trial failed on the memory it never wrote alone."""
    written = [torch.where(m, t.to(o.dtype), o) for o, m, t in zip(outputs, shown, trial.evaluation.truth)]
    record, category = judge_trial(trial, Forward({}, written), protocol)
    if category is None:
        record = replace(record, passed=False, category=Category.UNWRITTEN_OUTPUT,
                         note=f"the poison shows in {_poison_count(shown)}: it reads memory it never wrote")
    return record, category


def _poison_count(shown: list[torch.Tensor]) -> str:
    return f"{sum(int(m.sum()) for m in shown)} of {sum(m.numel() for m in shown)} output elements"


@dataclass
class Forward:
    reply: dict[str, Any]
    outputs: list[torch.Tensor] | None  # the parent's own copies (None: not delivered)


def forward(sb: Sandbox, inputs: list[Any], like: list[torch.Tensor], deadline: float, **flags: Any) -> Forward:
    """One forward in the child: inputs handed over, outputs taken back into the parent's memory on
    `like`'s device. `flags`: poison, checks, keep, reuse, late_inputs (see `Child.op_forward`)."""
    refs = sb.put(inputs, time_left(deadline))
    fields, receipt = sb.expect(like)
    reply = sb.call({"op": "forward", "inputs": refs, **fields, **flags}, time_left(deadline))
    return Forward(reply, sb.take(reply, receipt, time_left(deadline)))


def judge_trial(trial: TrialData, run: Forward, protocol: VerifiedProtocol) -> tuple[Trial, Category | None]:
    """The trial's record, and why it failed (None when it passed)."""
    ev = trial.evaluation
    if run.outputs is None:
        category, note = _shape_problem(run.reply, ev.baseline)
        return Trial(trial.distribution, trial.index, False, category=category, note=note), category
    j = judge_outputs(run.outputs, ev.truth, ev.baseline_err, protocol.tolerance)
    assert j.worst is not None and j.allowed is not None and j.baseline is not None
    category, note = None, ""
    if not j.passed:
        bf16 = trial.bf16_err()  # asked of a failing trial only: a bfloat16 forward of the reference
        category, note = _failure_category(j, bf16), _failure_note(j, bf16)
    rec = Trial(trial.distribution, trial.index, j.passed, max_rel_err=j.worst.elem, candidate_err=j.worst.norm,
                baseline_err=j.baseline.norm, allowed_err=j.allowed.norm, category=category, note=note)
    return rec, category


def _failure_category(j: Judgement, bf16: list[ErrorMeasure] | None) -> Category:
    """Why a failing trial failed: NaN/Inf where the truth has none (or the reverse); precision lost
    where every failing output errs within PRECISION_LOSS_FACTOR x what the reference itself errs in
    bfloat16 on the same trial (`bf16`, per output), an error bf16/fp16 math explains; a wrong value
    otherwise, whatever its size (a function without one of its ops can err less than 1%)."""
    assert j.worst is not None
    if not j.worst.nan_inf_match:
        return Category.NAN_INF_MISMATCH
    if bf16 is None:  # the reference cannot run in bfloat16: an absolute bound, all there is to go on
        lost = j.worst.norm < PRECISION_LOSS_BELOW
    else:
        lost = all(_within_bf16(j.errors[k], bf16[k]) for k in j.failing)
    return Category.PRECISION_LOSS if lost else Category.VALUE_MISMATCH


def _within_bf16(err: ErrorMeasure, bf16: ErrorMeasure) -> bool:
    k = PRECISION_LOSS_FACTOR
    return err.nan_inf_match and err.norm <= k * bf16.norm and err.elem <= k * bf16.elem


def _failure_note(j: Judgement, bf16: list[ErrorMeasure] | None) -> str:
    assert j.worst is not None and j.allowed is not None
    if not j.worst.nan_inf_match:
        return "NaN/Inf where the truth is finite (or the reverse)"
    note = (f"error {j.worst.norm:.2e} (normwise) / {j.worst.elem:.2e} (elementwise); "
            f"allowed {j.allowed.norm:.2e} / {j.allowed.elem:.2e}")
    if bf16 is None:
        return note
    own = bf16[j.errors.index(j.worst)]
    return note + f"; the reference in bfloat16 errs {own.norm:.2e} / {own.elem:.2e}"


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
    return judge_outputs(b, [x.detach().double() for x in a], ev.baseline_err, protocol.tolerance).passed


def _distribution_failure(result: CorrectnessResult) -> None:
    """Passing the problem's own inputs and failing a hidden distribution is named as such."""
    failed = {t.distribution for t in result.trials if not t.passed}
    passed_default = all(t.passed for t in result.trials if t.distribution == "default")
    if failed and passed_default and any(d in DISTRIBUTIONS and d != "default" for d in failed):
        result.categories.append(Category.DISTRIBUTION_FAILURE)
    result.categories = list(dict.fromkeys(result.categories))


def _retained(reply: dict[str, Any], trial: TrialData, result: CorrectnessResult) -> None:
    """What the candidate holds after import and construction, against one set of inputs and outputs
    (`kbv.detect.evidence.retained_state`); also on record when it is not flagged."""
    retained = reply.get("retained")
    if not isinstance(retained, dict):
        return
    weights = tensor_bytes(trial.state.values())
    found = retained_state(retained, io_bytes(trial.inputs, trial.evaluation.baseline), weights)
    if found is not None:
        result.hacks.setdefault(found[0].value, found[1])


def _put_state(sb: Sandbox, state: dict[str, torch.Tensor], deadline: float) -> dict[str, Any] | None:
    if not state:
        return None
    return dict(zip(state, sb.put(list(state.values()), time_left(deadline))))


# -- probes -----------------------------------------------------------------------------------

def run_probes(sb: Sandbox, prepared: PreparedProblem, protocol: VerifiedProtocol, deadline: float,
               result: CorrectnessResult) -> None:
    """After a clean pass: the late-input probe (GPU) and the reuse probes; what they find goes
    into `result` (hacks, categories). None runs for a candidate whose two runs on identical inputs
    disagreed (`unwritten_output`, `nondeterministic`): a probe judges one more output against the
    truth, and an output that differs from run to run fails it for that, not for a cache or a stream."""
    unsteady = {Category.UNWRITTEN_OUTPUT.value, Category.NONDETERMINISTIC.value} & set(result.integrity)
    with stage("probes"):
        trial = prepared.trials[-1]
        if _on_gpu(trial.inputs) and not unsteady:
            _late_input_probe(sb, trial, protocol, deadline, result)
        if not unsteady:
            _reuse_probes(sb, prepared, protocol, deadline, result)
        trial.release()


def _on_gpu(inputs: list[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


def _late_input_probe(sb: Sandbox, trial: TrialData, protocol: VerifiedProtocol, deadline: float,
                      result: CorrectnessResult) -> None:
    """A passing trial again, its inputs written on the current stream behind a spin (see
    `integrity.write_late`): a kernel on a stream that does not wait for the current one computes
    on poison. The device-wide synchronise of the timer already charges such work; this names it."""
    late = forward(sb, trial.inputs, trial.evaluation.baseline, deadline, late_inputs=LATE_INPUT_CYCLES)
    if late.outputs is None:
        return
    ev = trial.evaluation
    if not judge_outputs(late.outputs, ev.truth, ev.baseline_err, protocol.tolerance).passed:
        result.hacks.setdefault(Category.SIDE_STREAM.value,
                                f"{trial.label}: with its inputs written on the current stream just before the "
                                "call, the output came out wrong: the work ran on a stream that does not wait for "
                                "the current one")


def _reuse_probes(sb: Sandbox, prepared: PreparedProblem, protocol: VerifiedProtocol, deadline: float,
                  result: CorrectnessResult) -> None:
    """Rewrite a few values of the last trial's inputs in place (same tensors, same pointers: the child
    kept them) and check. A cache keyed on pointers, identities or a sample of values still hits, and
    returns what it stored for the old values; changing few elements keeps sampled keys unchanged
    with high probability, and still moves the true output well past the tolerance. A probe that
    fails is a stale result (`result_cache`) only where `_stale` says so; otherwise the candidate is
    wrong on the new values, and fails as such."""
    trial = prepared.trials[-1]
    device = next((x.device for x in trial.inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    gen = torch.Generator(device=device).manual_seed(trial_seed(prepared.secret, prepared.problem.hash, "reuse", 0))
    model = prepared.reference.build(trial.weight_seed)
    for probe in range(protocol.reuse_probes):
        fraction = REUSE_FRACTIONS[probe % len(REUSE_FRACTIONS)]
        inputs = [_some_new(x, gen, fraction) if is_continuous(x) else x for x in trial.inputs]
        ev = prepared.reference.evaluate(model, inputs)
        run = forward(sb, inputs, ev.baseline, deadline, reuse=True)
        probe_trial = TrialData(f"{trial.distribution}/reuse", probe, trial.weight_seed,
                                lambda inputs=inputs, ev=ev: (inputs, {}, ev))
        rec, category = judge_trial(probe_trial, run, protocol)
        stale = category is not None and _stale(sb, trial, probe_trial, inputs, run, protocol, deadline)
        # this probe's inputs, truth and outputs go before the next one's reference call (`kbv.memory_plan`)
        del inputs, ev, run, probe_trial
        if category is not None:
            if stale:
                result.categories.append(Category.RESULT_CACHE)
                result.notes.append(f"new values written into the same input memory gave the old values' result ({rec.note})")
            else:
                result.categories.append(category)
                result.notes.append(f"wrong on new values written into the same input memory ({rec.note})")
            result.trials.append(rec)
            return


def _stale(sb: Sandbox, trial: TrialData, probe: TrialData, inputs: list[Any], run: Forward,
           protocol: VerifiedProtocol, deadline: float) -> bool:
    """Whether a failed reuse probe's outputs are a stale result: the old values' truth (a cache keyed
    on a sample of the values), or right once the same new values come in fresh memory (a cache keyed
    on pointers or identities, whose entry may be any earlier call's). Else the candidate is wrong on
    the new values themselves. One more forward, on a failure only."""
    if run.outputs is not None and judge_outputs(run.outputs, trial.evaluation.truth, trial.evaluation.baseline_err,
                                                 protocol.tolerance).passed:
        return True
    fresh = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    again = forward(sb, fresh, probe.evaluation.baseline, deadline)
    del fresh
    return judge_trial(probe, again, protocol)[1] is None


def _some_new(x: torch.Tensor, gen: torch.Generator, fraction: float) -> torch.Tensor:
    """`x` with about a `fraction` of its elements (at least one) swapped for other elements of `x`, scaled:
    new values of the same distribution at random places. An input with structural zeros (a
    triangular matrix) keeps them, as the trials' draws do (`kbv.distributions`): only its nonzero
    elements change, to nonzero values, and a kernel that skips the zero half stays right."""
    flat = x.reshape(-1).clone()  # (numel,)
    places = flat.nonzero().reshape(-1) if has_structural_zeros(x) else None
    count = flat.numel() if places is None or places.numel() == 0 else places.numel()
    n = max(1, int(count * fraction))
    # places drawn independently, not a permutation of all `count`: torch's permutation of a 6 GiB
    # input sorts 24 GiB of keys on the device, and refuses more than 2**31 elements (cub's sort)
    picked = torch.randint(0, count, (n,), generator=gen, device=x.device)
    source = torch.randint(0, count, (n,), generator=gen, device=x.device)
    if places is not None and places.numel():
        picked, source = places[picked], places[source]
    flat[picked] = flat[source] * 1.5 + (flat[source] == 0).to(flat.dtype)  # keeps the sign: domains hold
    return flat.reshape(x.shape)
