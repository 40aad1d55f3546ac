"""Runs read for a report: each run's verdicts, the model each verdict is counted under, and the
candidates' sources (for highlighted findings).

`load_runs` is the report stage's only I/O on the store; everything after it is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from kbv.api import Report, load_report
from kbv.errors import UsageError
from kbv.metrics import Metrics, metrics_by_group
from kbv.report.leaderboard import NO_MODEL
from kbv.report.sources import find_sources
from kbv.store import open_store
from kbv.verdict import ProblemFailure, Verdict


@dataclass(frozen=True)
class Run:
    """One run directory as a report sees it."""

    path: Path
    report: Report
    default_model: str  # the label of verdicts that carry no model
    sources: dict[str, str] = field(default_factory=dict)  # candidate hash -> source text

    @cached_property
    def verdicts(self) -> tuple[Verdict, ...]:
        """The run's verdicts with `model` set to the label they are counted under."""
        return tuple(v if v.model else replace(v, model=self.default_model) for v in self.report.verdicts)


@dataclass(frozen=True)
class RunSet:
    """Several runs read together: what the HTML report and the leaderboard are built from."""

    runs: tuple[Run, ...]

    @cached_property
    def verdicts(self) -> tuple[Verdict, ...]:
        """Every run's verdicts, labelled with their models, in order."""
        return tuple(v for run in self.runs for v in run.verdicts)

    @property
    def sources(self) -> dict[str, str]:
        return {h: code for run in self.runs for h, code in run.sources.items()}

    def metrics(self) -> dict[str, dict[str, Metrics]]:
        """{protocol: {"all": ..., "L1": ...}} over every run's verdicts together."""
        return metrics_by_group(self.verdicts)

    def labeled(self) -> list[tuple[str, Verdict]]:
        """(run directory, verdict with its model label), in order."""
        return [(str(run.path), v) for run in self.runs for v in run.verdicts]

    def problem_failures(self) -> list[tuple[str, ProblemFailure]]:
        """(run directory, failure) for every problem failure still standing, in order."""
        return [(str(run.path), f) for run in self.runs for f in run.report.problem_failures]

    def stored(self) -> list[tuple[str, Verdict]]:
        """(run directory, verdict as stored, `model` None where none was recorded), in order."""
        return [(str(run.path), v) for run in self.runs for v in run.report.verdicts]


def load_runs(paths: Sequence[str], with_sources: bool = False) -> RunSet:
    """Read every run in `paths`. Raises StoreError for a path that holds no run, UsageError for none
    given or one given twice."""
    if not paths:
        raise UsageError("Name at least one run directory.")
    resolved = [Path(p).resolve() for p in paths]
    if len(set(resolved)) != len(resolved):
        raise UsageError("A run directory is named twice.")
    return RunSet(tuple(_load_run(Path(p), with_sources) for p in paths))


def _load_run(path: Path, with_sources: bool) -> Run:
    report = load_report(path)
    with open_store(path, create=False) as store:
        specs = [str(inv["config"].get("candidates", "")) for inv in store.invocations()]
    specs = [s for s in specs if s]
    sources: dict[str, str] = {}
    if with_sources:
        wanted = {v.candidate_hash for v in report.verdicts if v.findings}
        anchors = [path.resolve(), *path.resolve().parents][:4]
        sources = find_sources(specs, wanted, anchors) if wanted else {}
    return Run(path, report, _default_model(specs, path), sources)


def _default_model(specs: list[str], path: Path) -> str:
    """The candidates' name when every invocation evaluated the same candidates; else the run's name."""
    names = {Path(s.rstrip("/")).stem or s for s in specs}
    if len(names) == 1:
        return names.pop()
    return path.resolve().name if names else NO_MODEL
