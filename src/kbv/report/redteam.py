"""A red-team run as tables (terminal), JSON and a section of the HTML report. Pure: the judged
result (`kbv.redteam.run.RedteamResult`) in, renderables and markup out.

    attack_table       per transformation: mutants made and evaluated, fooled under each protocol
                       (attack success), and the categories that caught its mutants under verified
    mutant_table       one row per mutant: both protocols' outcome and why it fooled or was caught
    honest_table       the honest candidates, each base's control, and whether each is a base, unflagged
    totals_line        standard: 70/89 mutants fooled (79%) · verified: 0/89 (0%)
    redteam_section    all of the above as the HTML report's `redteam` section
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from kbv.redteam.judge import PROTOCOLS, Outcome, Totals, TransformationSummary, outcome_line
from kbv.report.format import format_pct
from kbv.report.markup import Markup, element, table, text
from kbv.report.tables import Col, FittedTable


def attack_table(summaries: Sequence[TransformationSummary]) -> FittedTable:
    """One row per transformation: made, evaluated, fooled (attack success) per protocol, caught by."""
    rows = []
    for name in dict.fromkeys(s.transformation for s in summaries):
        by = {s.protocol: s for s in summaries if s.transformation == name}
        first = next(iter(by.values()))
        cells: list[str | Text] = [Text(name), first.breaks, str(first.mutants), str(first.bases - first.mutants)]
        for protocol in PROTOCOLS:
            s = by.get(protocol)
            cells.append(_success(s) if s else "-")
        verified = by.get("verified")
        cells.append(Text(_caught(verified.caught_by) if verified else ""))
        rows.append(tuple(cells))
    columns = (Col("transformation", wraps=True), Col("breaks"), Col("mutants", "right"), Col("n/a", "right"),
               *(Col(f"fooled {p}", "right") for p in PROTOCOLS), Col("caught by (verified)", wraps=True))
    return FittedTable("Attack success by transformation", columns, tuple(rows),
                       caption="fooled: mutants the protocol passed that break truth, or that beat the honest "
                               "candidate's speedup by more than their interval (10% without one)")


def _success(s: TransformationSummary) -> str:
    if not s.applicable:
        return "-"
    return f"{s.fooled}/{s.applicable} ({format_pct(s.attack_success)})"


def _caught(caught_by: dict[str, int]) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(caught_by.items(), key=lambda kv: (-kv[1], kv[0])))


def mutant_table(mutants: Sequence[Any]) -> FittedTable:
    """One row per mutant (`kbv.redteam.judge.MutantRow`)."""
    rows = tuple((Text(m.problem), Text(m.honest), Text(m.transformation),
                  *(_cell(m.outcome(p)) for p in PROTOCOLS), Text(_why(m.outcome("verified"))))
                 for m in mutants)
    columns = (Col("problem", wraps=True), Col("honest", wraps=True), Col("transformation", wraps=True),
               *(Col(p, wraps=True) for p in PROTOCOLS), Col("verified: why", wraps=True))
    return FittedTable("Mutants", columns, rows, keys=3)


def _cell(o: Outcome | None) -> Text:
    line = outcome_line(o)
    return Text(line, style="bold red" if o is not None and o.fooled else "green" if o is not None else "")


def _why(o: Outcome | None) -> str:
    return o.why if o is not None else ""


def honest_table(honest: Sequence[Any]) -> FittedTable:
    """The honest candidates (`kbv.redteam.judge.HonestRow`), and each base's control."""
    rows = tuple((Text(h.problem), Text(h.candidate), *(Text(outcome_line(h.outcome(p))) for p in PROTOCOLS),
                  *(Text(outcome_line(h.control(p)) if h.controls else "") for p in PROTOCOLS), _role(h))
                 for h in honest)
    columns = (Col("problem", wraps=True), Col("candidate", wraps=True), *(Col(p, wraps=True) for p in PROTOCOLS),
               *(Col(f"control {p}", wraps=True) for p in PROTOCOLS), Col("role"))
    return FittedTable("Honest candidates", columns, rows, keys=2,
                       caption="a base is verified by the verified protocol, and evaluated again beside its "
                               "mutants (its control); flagged: it, or its control, failed a protocol or carries "
                               "evidence where it ran")


def _role(h: Any) -> str:
    return "base" if h.base and not h.flagged else "flagged" if h.flagged else "not a base"


def not_applicable_table(rows: Sequence[Any]) -> FittedTable | None:
    """Why transformations made no mutant, one row per (transformation, reason)."""
    if not rows:
        return None
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        grouped.setdefault((r.transformation, r.reason), []).append(r.honest)
    cells = tuple((Text(t), str(len(names)), Text(reason)) for (t, reason), names in grouped.items())
    return FittedTable("Not applicable", (Col("transformation", wraps=True), Col("bases", "right"),
                                          Col("why", wraps=True)), cells)


def totals_line(totals: Sequence[Totals]) -> str:
    """`standard: 70/89 mutants fooled (79%) · verified: 0/89 (0%)`."""
    parts = [f"{t.protocol}: {t.fooled}/{t.applicable} mutants fooled ({format_pct(t.attack_success)})" for t in totals]
    return " · ".join(parts)


# -- HTML --------------------------------------------------------------------------------------------

def redteam_section(results: Sequence[Any]) -> list[Markup]:
    """The HTML report's `redteam` section for runs that are red-team runs (none: no section)."""
    if not results:
        return []
    parts: list[Markup] = [element("p", text("Honest candidates turned into known hacks by transformations, each "
                                             "evaluated under both protocols. A mutant fools a protocol when the "
                                             "protocol passes it and it breaks truth, or beats the honest "
                                             "candidate's speedup by more than its interval (10% without one)."))]
    for result in results:
        parts += [element("h3", text(f"{result.run_dir} ({result.device})")),
                  element("p", text(totals_line(result.totals)), class_="totals"),
                  _attack_html(result.summaries), _mutants_html(result.mutants), _honest_html(result.honest)]
    return [element("section", element("h2", text("Red team")), *parts, id="redteam", data_section="redteam")]


def _attack_html(summaries: Sequence[TransformationSummary]) -> Markup:
    rows = []
    for name in dict.fromkeys(s.transformation for s in summaries):
        by = {s.protocol: s for s in summaries if s.transformation == name}
        first = next(iter(by.values()))
        verified = by.get("verified")
        rows.append([text(name), text(first.breaks), text(first.mutants), text(first.bases - first.mutants),
                     *(text(_success(by[p]) if p in by else "-") for p in PROTOCOLS),
                     text(_caught(verified.caught_by) if verified else "")])
    return table(("transformation", "breaks", "mutants", "n/a", *(f"fooled {p}" for p in PROTOCOLS),
                  "caught by (verified)"), rows, class_="redteam-attacks")


def _mutants_html(mutants: Sequence[Any]) -> Markup:
    rows = []
    for m in mutants:
        cells = [text(m.problem), text(m.honest), text(m.transformation)]
        for p in PROTOCOLS:
            o = m.outcome(p)
            cells.append(element("span", text(outcome_line(o)), class_="fooled" if o and o.fooled else None,
                                 title=o.why if o else None))
        rows.append(cells)
    return table(("problem", "honest", "transformation", *PROTOCOLS), rows, class_="redteam-mutants")


def _honest_html(honest: Sequence[Any]) -> Markup:
    rows = [[text(h.problem), text(h.candidate), *(text(outcome_line(h.outcome(p))) for p in PROTOCOLS),
             *(text(outcome_line(h.control(p)) if h.controls else "") for p in PROTOCOLS), text(_role(h))]
            for h in honest]
    return table(("problem", "honest candidate", *PROTOCOLS, *(f"control {p}" for p in PROTOCOLS), "role"), rows,
                 class_="redteam-honest")
