"""Problem soundness: can a trivial candidate pass, does the output depend on the inputs, is the
reference deterministic? Judged with the verified protocol's own acceptance test, per applicable
distribution. A flagged problem still runs; its verdicts carry the flags.

The trivial battery: identity (the first input, where it has the output's shape), zeros, ones, the
output's mean everywhere, uninitialised memory, and the reference at another input of the same
distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kbv.compare import judge_outputs, measure_error

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

    @property
    def sound(self) -> bool:
        return not self.flags


def _trivials(trial: TrialData, other: TrialData | None) -> dict[str, Callable[[torch.Tensor], torch.Tensor | None]]:
    """The trivial candidates, as functions of a reference output (None: the trivial does not apply,
    e.g. the identity of an input of another shape)."""
    first = next((x for x in trial.inputs if isinstance(x, torch.Tensor)), None)

    def mean(ref: torch.Tensor) -> torch.Tensor | None:
        # a scalar's own mean is the answer itself: use the value at another draw, a constant a
        # candidate could know
        if ref.numel() <= 1:
            if other is None:
                return None
            return torch.full_like(ref, float(other.evaluation.truth[0].double().mean()))
        return torch.full_like(ref, float(ref.double().mean()))

    def identity(ref: torch.Tensor) -> torch.Tensor | None:
        if first is None or first.shape != ref.shape:
            return None
        return first.to(ref.dtype)

    def uninitialised(ref: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(ref)

    return {
        "identity": identity,
        "zeros": torch.zeros_like,
        "ones": torch.ones_like,
        "mean": mean,
        "uninitialised": uninitialised,
    }


def _passes(outputs: list[torch.Tensor], trial: TrialData, protocol: VerifiedProtocol) -> bool:
    ev = trial.evaluation
    return judge_outputs(outputs, ev.truth, ev.baseline_err, protocol.tolerance).passed


@dataclass(frozen=True)
class Screen:
    """What the screen found. `unjudgeable`: the flags under which no verdict of the verified
    protocol means anything (a nondeterministic reference: its truth is one draw of a random
    function, and the baseline's own error, which sets the tolerance, is that randomness); a
    problem with one is `unsound_problem` for every candidate."""

    flags: tuple[str, ...]
    notes: tuple[str, ...]
    unjudgeable: tuple[str, ...] = ()


def screen_trials(ctx: PreparedProblem, protocol: VerifiedProtocol, sensitivity: bool = False) -> Screen:
    """A trivial candidate that passes on EVERY applicable distribution would be verified: that
    flags the problem. Passing on some distributions only is a note (the hidden ones catch it:
    ReLU's identity passes on its own all-positive inputs, by construction). An output that does
    not depend on its inputs, or a nondeterministic reference, on any distribution, flags; the
    latter makes the problem unjudgeable."""
    by_dist: dict[str, list[TrialData]] = {}
    for t in ctx.trials:
        by_dist.setdefault(t.distribution, []).append(t)
    passes: dict[str, list[str]] = {}
    flags: list[str] = []
    unjudgeable: list[str] = []
    for dist, trials in by_dist.items():
        first = trials[0]
        for name, make in _trivials(first, trials[1] if len(trials) > 1 else None).items():
            outputs = [make(b) for b in first.evaluation.baseline]
            if all(o is not None for o in outputs) and _passes(outputs, first, protocol):
                passes.setdefault(name, []).append(dist)
        model = ctx.reference.build(first.weight_seed)
        again = ctx.reference.baseline_outputs(model, first.inputs)
        # against the first run itself: a random reference also makes its own tolerance huge
        drift = max((measure_error(b.double(), a).worst for a, b in zip(again, first.evaluation.baseline)),
                    default=0.0)
        if drift > NONDETERMINISM_LIMIT or not _passes(again, first, protocol):
            unjudgeable.append(f"nondeterministic reference on {dist} (two runs differ by {drift:.1e})")
            flags.append(unjudgeable[-1])
        if len(trials) > 1:
            other = ctx.reference.baseline_outputs(model, trials[1].inputs)
            if _same_shapes(other, first) and _passes(other, first, protocol):
                flags.append(f"the output at other inputs passes on {dist}")
            if sensitivity:
                flags += _insensitive_inputs(ctx, model, first, trials[1], protocol, dist)
        for t in trials:
            t.release()
    notes = []
    for name, dists in passes.items():
        if set(dists) == set(by_dist):
            flags.append(f"{name} passes on every distribution")
        else:
            notes.append(f"{name} passes on {', '.join(dists)} only")
    return Screen(tuple(flags), tuple(notes), tuple(unjudgeable))


def _insensitive_inputs(ctx: PreparedProblem, model: Any, first: TrialData, second: TrialData,
                        protocol: VerifiedProtocol, dist: str) -> list[str]:
    flags = []
    for k, (x, y) in enumerate(zip(first.inputs, second.inputs)):
        if not isinstance(x, torch.Tensor) or torch.equal(x, y):
            continue
        swapped = list(first.inputs)
        swapped[k] = y
        outputs = ctx.reference.baseline_outputs(model, swapped)
        if _same_shapes(outputs, first) and _passes(outputs, first, protocol):
            flags.append(f"the output does not depend on input {k} on {dist}")
    return flags


def _same_shapes(outputs: list[torch.Tensor], trial: TrialData) -> bool:
    return all(o.shape == t.shape for o, t in zip(outputs, trial.evaluation.truth))


def check_problem(ctx: PreparedProblem, protocol: VerifiedProtocol) -> SoundnessReport:
    """The full screen of `kbv problems check` (with the per-input sensitivity test)."""
    found = screen_trials(ctx, protocol, sensitivity=True)
    return SoundnessReport(ctx.problem.key, dict(ctx.calibration.variants), dict(ctx.calibration.notes),
                           found.flags, found.notes)
