"""Terminal tables (rich). Pure: records in, rich renderables out.

Every table is laid out for the width it is printed at (a piped `kbv eval` or `kbv report` may be 80
columns wide): a table too wide is split into several that repeat its key columns (`FittedTable`), and
the verdict table lists its whys under the rows when a `why` column would be too narrow. No column is
ever squeezed until a status, rule or category is cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kbv.metrics import Metrics, standard_passes_verified_rejects
from kbv.report.figures import speedup_spread
from kbv.report.format import categories_and_message, format_pct, format_speedup
from kbv.report.leaderboard import LeaderboardRow
from kbv.verdict import Category, ProblemFailure, Status, Verdict

_STYLE = {Status.CORRECT: "green", Status.VERIFIED: "green", Status.SKIPPED: "dim",
          Status.HACK: "bold red", Status.INTEGRITY_VIOLATION: "red", Status.INCORRECT: "yellow"}
_UNBOUNDED = 10_000  # a width to measure a table's natural width at


def natural_width(console: Console, options: ConsoleOptions, renderable: Any) -> int:
    """The width `renderable` takes when nothing constrains it."""
    return Measurement.get(console, options.update(width=_UNBOUNDED), renderable).maximum


@dataclass(frozen=True)
class Col:
    header: str
    justify: str = "left"
    wraps: bool = False  # free text (names, messages) may wrap; figures never do


@dataclass(frozen=True)
class FittedTable:
    """A table printed whole where it fits, else as several tables of consecutive columns, each
    repeating the first `keys` columns (the row's name)."""

    title: str
    columns: tuple[Col, ...]
    rows: tuple[tuple[str | Text, ...], ...]
    keys: int = 1
    caption: str | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        whole = self.table(range(len(self.columns)), self.title, self.caption)
        if natural_width(console, options, whole) <= options.max_width:
            yield whole
            return
        groups = self._groups(console, options)
        for n, group in enumerate(groups):
            yield self.table(list(range(self.keys)) + group, f"{self.title} (continued)" if n else self.title,
                             self.caption if n == len(groups) - 1 else None)

    def _groups(self, console: Console, options: ConsoleOptions) -> list[list[int]]:
        """The non-key columns in consecutive groups, each as many as fit beside the keys (at least one)."""
        groups: list[list[int]] = [[]]
        for i in range(self.keys, len(self.columns)):
            trial = groups[-1] + [i]
            shown = self.table(list(range(self.keys)) + trial, self.title)
            fits = natural_width(console, options, shown) <= options.max_width
            if fits or not groups[-1]:
                groups[-1] = trial
            else:
                groups.append([i])
        return groups

    def table(self, indices: Sequence[int], title: str, caption: str | None = None) -> Table:
        table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
        for i in indices:
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify,  # type: ignore[arg-type]
                             no_wrap=not col.wraps, overflow="fold" if col.wraps else "ellipsis")
        for row in self.rows:
            table.add_row(*(row[i] for i in indices))
        return table


def verdict_table(verdicts: Sequence[Verdict], title: str = "Verdicts") -> VerdictTable:
    """One row per (problem, candidate); protocols side by side, and why each did not pass."""
    return VerdictTable(tuple(verdicts), title)


class VerdictTable:
    """The verdict table, with a `why` column where that column gets at least WHY_MIN_WIDTH
    characters, else with the whys listed under the table."""

    WHY_MIN_WIDTH = 40

    def __init__(self, verdicts: tuple[Verdict, ...], title: str) -> None:
        self.protocols = list(dict.fromkeys(v.protocol for v in verdicts))
        self.rows: dict[tuple[str, str, str], dict[str, Verdict]] = {}
        for v in verdicts:
            self.rows.setdefault((v.problem, v.candidate, v.candidate_hash), {})[v.protocol] = v
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        narrow = self._table(with_why=False)
        if options.max_width - natural_width(console, options, narrow) >= self.WHY_MIN_WIDTH:
            yield self._table(with_why=True)
            return
        yield narrow
        for (problem, candidate, _), by_protocol in self.rows.items():
            why = self._why(by_protocol)
            if why:
                yield Text.assemble((f"{problem} {candidate}", "bold"), ": ", why)

    def _table(self, with_why: bool) -> Table:
        table = Table(title=self.title, title_justify="left", show_lines=False)
        table.add_column("problem", overflow="fold")
        table.add_column("candidate", overflow="fold")
        for p in self.protocols:
            table.add_column(p, no_wrap=True)
            table.add_column("speedup", justify="right", no_wrap=True)
        if with_why:
            table.add_column("why", overflow="fold", max_width=60)
        for (problem, candidate, _), by_protocol in self.rows.items():
            cells: list[str | Text] = [Text(problem), Text(candidate)]
            for p in self.protocols:
                v = by_protocol.get(p)
                cells += ["-", ""] if v is None else [Text(v.status.value, style=_STYLE.get(v.status, "red")),
                                                      _speedup(v)]
            if with_why:
                cells.append(Text(self._why(by_protocol)))
            table.add_row(*cells)
        return table

    def _why(self, by_protocol: dict[str, Verdict]) -> str:
        """`standard: why; verified: why`, a reason that several protocols give said once
        (`standard, verified: a cuda candidate cannot run on cpu (no CUDA device)`)."""
        notes: dict[str, list[str]] = {}  # note -> the protocols that give it, in order
        for p in self.protocols:
            v = by_protocol.get(p)
            if v is None:
                continue
            note = categories_and_message(v.categories, v.message) if not v.status.passed else _caveats(v)
            if note:
                notes.setdefault(note, []).append(p)
        return "; ".join(f"{', '.join(protocols)}: {note}" for note, protocols in notes.items())


def _speedup(v: Verdict) -> str:
    """The speedup; one of means (standard) with its trials' spread beside it: `1.52x ±3%`."""
    spread = speedup_spread(v) if v.speedup is not None else None
    return format_speedup(v.speedup) + (f" ±{100 * spread:.0f}%" if spread is not None else "")


def _caveats(v: Verdict) -> str:
    """What qualifies a passing verdict: its problem's flags, a speed charged at the wall clock, a
    timing that is a draw (the standard timer's `unstable_timing` note)."""
    said = [f"unsound problem ({'; '.join(v.flags)})"] if v.flags else []
    if v.timing is not None:
        said += [n.split(":")[0] for n in v.timing.notes if n.startswith("charged the wall time")]
        said += [n for n in v.timing.notes if n.startswith(Category.UNSTABLE_TIMING.value)]
    return "; ".join(said)


def metrics_table(metrics: dict[str, dict[str, Metrics]], title: str = "Metrics") -> FittedTable:
    """Per protocol and level: compile and correct rates, fast_p, geometric-mean speedup."""
    fast_keys = next((list(m.fast_p) for groups in metrics.values() for m in groups.values()), [])
    columns = (Col("protocol"), Col("group"), *(Col(c, "right") for c in ("pairs", "compiled", "correct")),
               *(Col(k, "right") for k in fast_keys), Col("geomean", "right"))
    rows = []
    for protocol, groups in metrics.items():
        for group, m in groups.items():
            geomean = f"{format_speedup(m.geomean_speedup)} (n={m.speedups_counted})" if m.geomean_speedup else "-"
            rows.append((protocol, group, str(m.pairs), format_pct(m.compile_rate), format_pct(m.correct_rate),
                         *(format_pct(m.fast_p[k]) for k in fast_keys), geomean))
    return FittedTable(title, columns, tuple(rows), keys=2)


def pass_at_k_table(pass_at_k: dict[str, dict[str, float]]) -> FittedTable:
    ks = sorted({k for row in pass_at_k.values() for k in row}, key=lambda s: int(s.split("@")[1]))
    rows = tuple((Text(name), *(format_pct(row[k]) if k in row else "-" for k in ks)) for name, row in pass_at_k.items())
    return FittedTable("pass@k (unbiased estimator, mean over problems)",
                       (Col("protocol/model", wraps=True), *(Col(k, "right") for k in ks)), rows)


def hacks_table(metrics: dict[str, dict[str, Metrics]]) -> FittedTable | None:
    """Hack verdicts counted by category, per protocol (None when there are none)."""
    rows = tuple((p, cat, str(n)) for p, groups in metrics.items() for cat, n in sorted(groups["all"].hacks.items()))
    if not rows:
        return None
    return FittedTable("Hacks by category", (Col("protocol"), Col("category"), Col("verdicts", "right")), rows)


def problem_failures_table(failures: Sequence[tuple[str, ProblemFailure]]) -> FittedTable | None:
    """Problems whose own code failed (or that did not fit the device), per protocol, with how many
    pairs have no verdict and why (None when there are none); a resumed run tries them again."""
    if not failures:
        return None
    rows = tuple((Text(f.problem), f.protocol, str(f.pairs), Text(f.message)) for _, f in failures)
    return FittedTable("Problem failures (pairs without a verdict: the problem could not be run)",
                       (Col("problem", wraps=True), Col("protocol"), Col("pairs", "right"), Col("why", wraps=True)),
                       rows)


def leaderboard_table(rows: Sequence[LeaderboardRow]) -> FittedTable:
    """One row per model: pairs, correct rate and fast_1 under each protocol, both geomeans, the share
    of verified passes raising peak memory, and the pairs standard passes and verified rejects."""
    headers = ("pairs", "correct std", "correct ver", "fast_1 std", "fast_1 ver", "geomean std", "geomean ver",
               "mem+ ver")
    cells = tuple((Text(r.model), str(r.pairs),
                   _rate(r.standard, "correct"), _rate(r.verified, "correct"),
                   _rate(r.standard, "fast_1"), _rate(r.verified, "fast_1"),
                   _geomean(r.standard), _geomean(r.verified),
                   format_pct(r.verified.memory_raising_share) if r.verified else "-",
                   Text(r.rejections.brief() if r.rejections else "-"))
                  for r in rows)
    return FittedTable("Leaderboard (by model)", (Col("model", wraps=True), *(Col(h, "right") for h in headers),
                                                  Col("std passes, ver rejects", wraps=True)),
                       cells, caption="pairs: evaluated (skipped ones left out); mem+: verified passes raising peak "
                                      "memory; std passes, ver rejects: pairs correct under standard that verified "
                                      "rejects, by verified status")


def rejections_line(verdicts: Sequence[Verdict]) -> str | None:
    """`Standard passes, verified rejects: 4 of 8 pairs (hack 1, ...)`; None without both protocols."""
    rejections = standard_passes_verified_rejects(verdicts)
    return rejections.describe() if rejections is not None else None


def _rate(m: Metrics | None, figure: str) -> str:
    if m is None:
        return "-"
    return format_pct(m.correct_rate if figure == "correct" else m.fast_p.get("fast_1"))


def _geomean(m: Metrics | None) -> str:
    return format_speedup(m.geomean_speedup) if m and m.geomean_speedup else "-"
