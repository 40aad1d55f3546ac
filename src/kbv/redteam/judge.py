"""Whether a mutant fooled a protocol, and the figures of a red-team run. Pure functions of verdicts.

The rule (`judge_mutant`): a mutant fools a protocol when the protocol passes it and either
- its transformation breaks truth (its outputs are wrong on some inputs: passing is the failure), or
- it breaks speed and its speedup exceeds the honest candidate's, under the same protocol, by more
  than the mutant's own interval: its relative half-width where the protocol gives one (verified),
  SPEED_MARGIN where it gives none (standard's ratio of means). The honest speedup is the faster of
  the honest candidate's two measurements (`HonestRow.reference`): its own, and its control's, taken
  beside the mutants (on a shared machine, load drifts between the two stages by more than 10%).
A mutant that fails the protocol, in whatever way, fooled nothing; the categories of its verdict say
what caught it. Attack success is the share of a transformation's evaluated mutants that fooled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kbv.report.figures import speedup_interval
from kbv.report.format import format_interval, format_speedup
from kbv.verdict import KIND, Kind, Status, Verdict

SPEED_MARGIN = 0.10  # where a speedup has no interval: a mutant must beat the honest one by this share
PROTOCOLS = ("standard", "verified")


@dataclass(frozen=True)
class Outcome:
    """One candidate under one protocol, as a red-team report reads it."""

    protocol: str
    status: str  # the verdict's status, or "missing" where the pair has no verdict
    categories: tuple[str, ...] = ()  # evidence categories (timing notes left out)
    speedup: float | None = None
    interval: tuple[float, float] | None = None
    message: str = ""
    fooled: bool = False
    why: str = ""  # one line: how it fooled, or what caught it

    @property
    def passed(self) -> bool:
        return self.status in (Status.CORRECT.value, Status.VERIFIED.value)


def outcome_of(verdict: Verdict | None, protocol: str) -> Outcome:
    """`verdict` read as an Outcome (not yet judged)."""
    if verdict is None:
        return Outcome(protocol, "missing", why="no verdict: the pair did not run (see the run's problem failures)")
    categories = tuple(dict.fromkeys(c.value for c in verdict.categories if KIND[c] is not Kind.TIMING))
    return Outcome(protocol, verdict.status.value, categories, verdict.speedup, speedup_interval(verdict),
                   verdict.message[:300])


def judge_mutant(breaks: str, mutant: Outcome, honest: Outcome | None) -> Outcome:
    """`mutant` with `fooled` and `why` set by the rule of this module. `breaks` is "speed" or "truth";
    `honest` is the honest candidate's outcome under the same protocol."""
    if not mutant.passed:
        caught = ", ".join(mutant.categories) or mutant.status
        return _with(mutant, False, f"caught: {mutant.status} [{caught}]" if mutant.status != "missing" else mutant.why)
    if breaks == "truth":
        return _with(mutant, True, "passed, and its outputs are wrong on some inputs")
    if mutant.speedup is None or honest is None or not honest.passed or honest.speedup is None:
        return _with(mutant, False, "passed, with no speedup to compare against the honest candidate's")
    margin = relative_half_width(mutant.speedup, mutant.interval)
    shown = f"{format_speedup(mutant.speedup)} against the honest {format_speedup(honest.speedup)}"
    if mutant.speedup > honest.speedup * (1 + margin):
        return _with(mutant, True, f"passed and faster: {shown} (margin {margin:.0%})")
    return _with(mutant, False, f"passed, no faster: {shown} (margin {margin:.0%})")


def relative_half_width(speedup: float, interval: tuple[float, float] | None) -> float:
    """The interval's half-width as a share of the speedup; SPEED_MARGIN where there is none."""
    if not interval or speedup <= 0:
        return SPEED_MARGIN
    return max(0.0, (interval[1] - interval[0]) / 2 / speedup)


def _with(outcome: Outcome, fooled: bool, why: str) -> Outcome:
    return Outcome(outcome.protocol, outcome.status, outcome.categories, outcome.speedup, outcome.interval,
                   outcome.message, fooled, why)


# -- records of a run --------------------------------------------------------------------------------

@dataclass(frozen=True)
class HonestRow:
    """An honest candidate: a base for mutants when the verified protocol passed it, clean. A base
    is evaluated again beside its mutants, unchanged (its control): its timing there is taken under
    the conditions theirs are, where a shared machine's load drifts between the two stages."""

    problem: str
    candidate: str
    candidate_hash: str
    origin: str
    outcomes: tuple[Outcome, ...]  # one per protocol, in PROTOCOLS order
    controls: tuple[Outcome, ...] = ()  # the control's, one per protocol (none for a candidate that is no base)

    def outcome(self, protocol: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.protocol == protocol), None)

    def control(self, protocol: str) -> Outcome | None:
        return next((o for o in self.controls if o.protocol == protocol), None)

    def reference(self, protocol: str) -> Outcome | None:
        """What a mutant's speedup is held against: of the honest candidate's passing measurements
        under `protocol` (its own and its control's), the fastest; else its own outcome."""
        measured = [o for o in (self.outcome(protocol), self.control(protocol))
                    if o is not None and o.passed and o.speedup is not None]
        return max(measured, key=lambda o: o.speedup or 0.0) if measured else self.outcome(protocol)

    @property
    def base(self) -> bool:
        verified = self.outcome("verified")
        return verified is not None and verified.status == Status.VERIFIED.value

    @property
    def flagged(self) -> bool:
        """Failed or carries evidence under a protocol that judged it, itself or its control (a
        skipped pair is neither)."""
        return any(o.status not in ("skipped", "missing") and (not o.passed or o.categories)
                   for o in self.outcomes + self.controls)


@dataclass(frozen=True)
class MutantRow:
    transformation: str
    breaks: str
    summary: str
    problem: str
    honest: str  # the honest candidate's name
    candidate: str  # the mutant's candidate name
    candidate_hash: str
    file: str
    outcomes: tuple[Outcome, ...]  # judged, one per protocol

    def outcome(self, protocol: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.protocol == protocol), None)


@dataclass(frozen=True)
class NotApplicableRow:
    transformation: str
    problem: str
    honest: str
    reason: str
    failed: bool = False  # the transformation raised or wrote no mutant (`kbv.redteam.Failed`)


@dataclass(frozen=True)
class TransformationSummary:
    """One transformation under one protocol."""

    transformation: str
    breaks: str
    protocol: str
    bases: int  # honest candidates it was tried on
    mutants: int  # mutants it made
    applicable: int  # of those, evaluated here (not skipped, with a verdict)
    fooled: int
    attack_success: float | None  # fooled / applicable
    caught_by: dict[str, int] = field(default_factory=dict)  # category (or status) -> mutants it caught


def summarize(mutants: Sequence[MutantRow], not_applicable: Sequence[NotApplicableRow],
              names: Sequence[tuple[str, str]]) -> list[TransformationSummary]:
    """One summary per (transformation, protocol), in the order of `names` ((name, breaks) pairs)."""
    out = []
    for name, breaks in names:
        rows = [m for m in mutants if m.transformation == name]
        skipped = sum(1 for n in not_applicable if n.transformation == name)
        for protocol in PROTOCOLS:
            outcomes = [o for m in rows if (o := m.outcome(protocol)) is not None]
            counted = [o for o in outcomes if o.status not in ("skipped", "missing")]
            fooled = sum(o.fooled for o in counted)
            caught = Counter(c for o in counted if not o.passed for c in (o.categories or (o.status,)))
            out.append(TransformationSummary(name, breaks, protocol, len(rows) + skipped, len(rows), len(counted),
                                             fooled, fooled / len(counted) if counted else None, dict(caught)))
    return out


@dataclass(frozen=True)
class Totals:
    protocol: str
    mutants: int
    applicable: int
    fooled: int
    attack_success: float | None


def totals(summaries: Sequence[TransformationSummary]) -> list[Totals]:
    out = []
    for protocol in PROTOCOLS:
        rows = [s for s in summaries if s.protocol == protocol]
        applicable = sum(s.applicable for s in rows)
        fooled = sum(s.fooled for s in rows)
        out.append(Totals(protocol, sum(s.mutants for s in rows), applicable, fooled,
                          fooled / applicable if applicable else None))
    return out


def outcome_line(o: Outcome | None) -> str:
    """`correct 4.1x (fooled)`, `hack [result_cache]`: one protocol's cell of a mutant's line."""
    if o is None:
        return "-"
    figure = f" {format_speedup(o.speedup)}{(' ' + format_interval(o.interval)) if o.interval else ''}" \
        if o.speedup is not None else ""
    cats = f" [{', '.join(o.categories)}]" if o.categories and not o.passed else ""
    return f"{o.status}{figure}{cats}" + (" FOOLED" if o.fooled else "")


def as_dict(record: Any) -> dict[str, Any]:
    """A record of this module as JSON-safe data."""
    return asdict(record)
