"""Problem soundness: can a trivial candidate pass, does the output depend on the inputs, is the
reference deterministic? Judged with the verified protocol's own acceptance test, per applicable
distribution. A problem flagged as unjudgeable gives every candidate an `unsound_problem` verdict.

The trivial battery: identity (the first input, where it has the output's shape), zeros, ones, the
output's mean everywhere, uninitialised memory, and the reference at another input of the same
distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kbv.compare import allowed_error, constant_fails, judge_outputs, measure_error, within
from kbv.protocols.verified.rules import JUDGES_NOTHING

if TYPE_CHECKING:
    from kbv.protocols.verified.prepare import PreparedProblem, TrialData
    from kbv.protocols.verified.rules import VerifiedProtocol


NONDETERMINISM_LIMIT = 1e-4  # two runs of the baseline on the same inputs; atomics reorder sums by ~1e-7


@dataclass(frozen=True)
class SoundnessReport:
    problem: str
    calibration: dict[str, str | None]
    calibration_notes: dict[str, str]
    flags: tuple[str, ...]
    notes: tuple[str, ...] = ()
    unjudgeable: tuple[str, ...] = ()  # the flags that make every verified verdict `unsound_problem`
    drawn: tuple[str, ...] = ()  # the parameters drawn per weight seed (`kbv.weights`)

    @property
    def sound(self) -> bool:
        return not self.flags


Trivial = Callable[[torch.Tensor], "torch.Tensor | float | None"]


def _trivials(trial: TrialData, other: TrialData | None) -> dict[str, Trivial]:
    """The trivial candidates, as functions of a reference output: a tensor, a float for an output
    that is that value everywhere (judged from the truth's figures, no tensor made), or None where
    the trivial does not apply (the identity of an input of another shape)."""
    first = next((x for x in trial.inputs if isinstance(x, torch.Tensor)), None)

    def mean(ref: torch.Tensor) -> float | None:
        # a scalar's own mean is the answer itself: use the value at another draw, a constant a
        # candidate could know
        if ref.numel() <= 1:
            if other is None:
                return None
            return float(other.evaluation.truth[0].double().mean())
        return float(ref.double().mean())

    def identity(ref: torch.Tensor) -> torch.Tensor | None:
        if first is None or first.shape != ref.shape:
            return None
        return first.to(ref.dtype)

    def uninitialised(ref: torch.Tensor) -> float:
        # what a candidate's empty output holds in its own child: fresh pages, zeros (recycled memory
        # holds its own earlier output, the reference at other inputs, judged below). Never the
        # parent's own recycled memory: it may hold the very answer (the screen's second run of the
        # reference), which no child can read, and would flag a sound problem
        return 0.0

    return {
        "identity": identity,
        "zeros": lambda ref: 0.0,
        "ones": lambda ref: 1.0,
        "mean": mean,
        "uninitialised": uninitialised,
    }


def _passes(outputs: list[torch.Tensor], trial: TrialData, protocol: VerifiedProtocol) -> bool:
    ev = trial.evaluation
    return judge_outputs(outputs, ev.truth, ev.baseline_err, protocol.tolerance).passed


def _trivial_passes(made: list[torch.Tensor | float], trial: TrialData, protocol: VerifiedProtocol) -> bool:
    """Whether a trivial's outputs pass: one that is a constant failing on its normwise error alone
    fails without a tensor made (`constant_fails`); the rest are made and judged in full."""
    ev = trial.evaluation
    for out, truth, base in zip(made, ev.truth, ev.baseline_err):
        if isinstance(out, float) and constant_fails(out, truth, allowed_error(base, protocol.tolerance)):
            return False
    outputs = [torch.full_like(b, out) if isinstance(out, float) else out for out, b in zip(made, ev.baseline)]
    return _passes(outputs, trial, protocol)


@dataclass(frozen=True)
class Screen:
    """What the screen found. `flags`: what the problem as a whole has, on every distribution that
    judges anything (a trivial answer that passes everywhere, an output that ignores its inputs, a
    nondeterministic reference); `unjudgeable`: the flags under which no verdict of the verified
    protocol means anything, so that every candidate is `unsound_problem`; `notes`: one
    distribution's weakness, which the others cover (ReLU's identity passes on its own all-positive
    inputs, by construction); `inapplicable`: distribution -> why it judges nothing (the baseline's
    own error is comparable to the output), to be dropped like one calibration rejected."""

    flags: tuple[str, ...]
    notes: tuple[str, ...]
    unjudgeable: tuple[str, ...] = ()
    inapplicable: dict[str, str] = field(default_factory=dict)


class ScreenTally:
    """The screen, a distribution at a time (`add`), as the trials are made: each distribution's first
    trial is screened while its tensors are at hand, then let go. `result()` is the `Screen`."""

    def __init__(self, protocol: VerifiedProtocol, sensitivity: bool = False) -> None:
        self.protocol = protocol
        self.sensitivity = sensitivity
        self.unjudgeable: list[str] = []
        self.inapplicable: dict[str, str] = {}
        self.judged: list[str] = []
        self.passes: dict[str, list[str]] = {}  # what passed -> the distributions it passed on
        self.state_seen = False  # whether a second call of one model was made (`_nondeterministic`)

    def add(self, ctx: PreparedProblem, trials: list[TrialData]) -> None:
        """Screen one distribution on its first trial (and its second's inputs), adding to the findings."""
        first, dist = trials[0], trials[0].distribution
        ledger = ctx.reference.ledger
        with ledger.doing("screen", dist):
            # whether it keeps state across calls is a property of the model: seen on the first distribution
            twice, self.state_seen = not self.state_seen, True
            if (why := _nondeterministic(ctx, first, self.protocol, twice)) is not None:
                self.unjudgeable.append(why)
            if (why := _judges_nothing(first)) is not None:
                self.inapplicable[dist] = why
                return
            self.judged.append(dist)
            for name, make in _trivials(first, trials[1] if len(trials) > 1 else None).items():
                made = [make(b) for b in first.evaluation.baseline]
                if all(o is not None for o in made) and _trivial_passes(made, first, self.protocol):
                    self.passes.setdefault(name, []).append(dist)
                del made
            if len(trials) > 1:
                second = trials[1].drawn_inputs()  # its inputs alone: no reference call of its own is needed
                model = ctx.reference.build(first.weight_seed)
                other = ctx.reference.baseline_outputs(model, second)
                if _same_shapes(other, first) and _passes(other, first, self.protocol):
                    self.passes.setdefault("the output at other inputs", []).append(dist)
                del other
                if self.sensitivity:
                    for k in _insensitive_inputs(ctx, model, first, second, self.protocol):
                        self.passes.setdefault(f"the output without input {k}", []).append(dist)

    def result(self) -> Screen:
        """A trivial candidate, or the output at other inputs, that passes on EVERY distribution that
        judges anything would be verified: the problem is unjudgeable. On some distributions only, it
        is a note."""
        unjudgeable, inapplicable, judged = list(self.unjudgeable), dict(self.inapplicable), self.judged
        if not judged and not unjudgeable:
            unjudgeable.append("no input distribution judges anything: " + "; ".join(
                f"{d}: {why}" for d, why in inapplicable.items()))
        flags, notes = list(unjudgeable), [f"{d} judges nothing ({why})" for d, why in inapplicable.items()]
        for name, dists in self.passes.items():
            if set(dists) != set(judged):
                notes.append(f"{name} passes on {', '.join(dists)} only")
            elif name.startswith("the output without input"):  # it ignores an input: a flag, still judgeable
                flags.append(f"the output does not depend on input {name.rsplit(' ', 1)[-1]} on any distribution")
            else:
                flags.append(f"{name} passes on every distribution")
                unjudgeable.append(flags[-1])
        return Screen(tuple(flags), tuple(notes), tuple(unjudgeable), inapplicable)


def screen_trials(ctx: PreparedProblem, protocol: VerifiedProtocol, sensitivity: bool = False) -> Screen:
    """Screen the problem on the first trial of each distribution (see `Screen`, `ScreenTally`): the
    whole screen at once, over trials already laid out (the verified protocol screens each
    distribution as its trials are made instead, `kbv.protocols.verified.prepare`)."""
    tally = ScreenTally(protocol, sensitivity)
    by_dist: dict[str, list[TrialData]] = {}
    for t in ctx.trials:
        by_dist.setdefault(t.distribution, []).append(t)
    for trials in by_dist.values():
        try:  # one distribution's tensors at a time: a multi-GB problem's trials do not fit together
            tally.add(ctx, trials)
        finally:
            for t in trials:
                t.release()
    return tally.result()


def _nondeterministic(ctx: PreparedProblem, first: TrialData, protocol: VerifiedProtocol,
                      twice: bool = False) -> str | None:
    """Why the reference is not a function of its inputs on `first`'s distribution, or None. With
    `twice`, the same model is called again on the same inputs: a model that keeps state across calls
    (a recurrent cell whose hidden state each call replaces, kept in a plain attribute) answers
    otherwise the second time. Every trial of the verified protocol judges a candidate's calls against
    a fresh model's first (its two runs on identical inputs must agree, and so must its probes and its
    timed calls), so no verdict of such a problem would mean anything: it is unjudgeable, and no
    candidate is blamed for following its reference."""
    model = ctx.reference.build(first.weight_seed)
    again = ctx.reference.baseline_outputs(model, first.inputs)
    drift, passes = _rerun(again, first, protocol)
    if drift > NONDETERMINISM_LIMIT or not passes:
        return f"nondeterministic reference on {first.distribution} (two runs differ by {drift:.1e})"
    if not twice:
        return None
    count = len(again)
    del again  # it agreed with the trial's own baseline: the second call is measured against that, one output held at a time
    later = ctx.reference.baseline_outputs(model, first.inputs)
    drift, passes = _rerun(later, first, protocol)
    if len(later) != count or drift > NONDETERMINISM_LIMIT or not passes:
        return (f"stateful reference: a second call of one model on identical inputs differs from its first by "
                f"{drift:.1e} on {first.distribution} (state it keeps across calls): the verified protocol judges "
                "every call of a candidate against a freshly built model's first, so no verdict would mean anything")
    return None


def _rerun(outputs: list[torch.Tensor], first: TrialData, protocol: VerifiedProtocol) -> tuple[float, bool]:
    """How far a rerun of the reference is from the trial's own baseline outputs (measured against the
    first run itself: a random reference also makes its own tolerance huge), and whether it passes.
    A rerun bitwise equal to the baseline (a deterministic reference: almost every one) needs no pass
    over its outputs: its drift is 0, and its error is the baseline's own, which passes where the
    baseline is within what it allows itself."""
    ev = first.evaluation
    same = len(outputs) == len(ev.baseline) == len(ev.truth) and all(
        a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(outputs, ev.baseline))
    if same:
        return 0.0, all(within(e, allowed_error(e, protocol.tolerance)) for e in ev.baseline_err)
    drift = max((measure_error(b.double(), a).worst for a, b in zip(outputs, ev.baseline)), default=0.0)
    return drift, _passes(outputs, first, protocol)


def _judges_nothing(trial: TrialData) -> str | None:
    """Why a distribution judges nothing, or None: the baseline's own error is comparable to the
    output, so the tolerance it sets admits any answer of the right scale."""
    noise = max((e.norm for e in trial.evaluation.baseline_err), default=0.0)
    if noise <= JUDGES_NOTHING:  # NaN never exceeds it: calibration keeps only finite outputs
        return None
    return f"the baseline's own error is {noise:.1e} of the output: what it computes is below its own rounding"


def _insensitive_inputs(ctx: PreparedProblem, model: Any, first: TrialData, second: list[Any],
                        protocol: VerifiedProtocol) -> list[int]:
    """The inputs whose swap for another draw's (`second`) leaves the output passing."""
    found = []
    for k, (x, y) in enumerate(zip(first.inputs, second)):
        if not isinstance(x, torch.Tensor) or torch.equal(x, y):
            continue
        swapped = list(first.inputs)
        swapped[k] = y
        outputs = ctx.reference.baseline_outputs(model, swapped)
        if _same_shapes(outputs, first) and _passes(outputs, first, protocol):
            found.append(k)
    return found


def _same_shapes(outputs: list[torch.Tensor], trial: TrialData) -> bool:
    return all(o.shape == t.shape for o, t in zip(outputs, trial.evaluation.truth))


def check_problem(ctx: PreparedProblem, protocol: VerifiedProtocol) -> SoundnessReport:
    """The full screen of `kbv problems check` (with the per-input sensitivity test): the screen its
    preparation made (`prepare_trials(..., sensitivity=True)`), else made now."""
    found = ctx.screen if ctx.screen is not None and ctx.screen_sensitive else screen_trials(ctx, protocol,
                                                                                             sensitivity=True)
    variants = {d: (None if d in found.inapplicable else v) for d, v in ctx.calibration.variants.items()}
    notes = {**ctx.calibration.notes, **{d: "not applicable: " + why for d, why in found.inapplicable.items()}}
    return SoundnessReport(ctx.problem.key, variants, notes, found.flags, found.notes, found.unjudgeable,
                           ctx.reference.drawn)
