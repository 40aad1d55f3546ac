"""The static HTML report: one self-contained file (inline SVG plots, inline CSS and a little JS).

Pure: `render_html(runs, plots, generated_at)` returns the page. Sections, each a `<section id=...>`:

    summary      both protocols side by side: rates, fast_p, the geomean and its rule, memory; the pairs
                 standard passes and verified rejects, by status; hacks by category
    leaderboard  one row per model (`kbv.report.leaderboard`)
    plots        the figures of `kbv.report.plots`, each `<figure data-plot=KEY data-series=N>`
    redteam      a red-team run's attack success per transformation, its mutants and honest candidates
                 (`kbv.report.redteam`; only for runs `kbv redteam` made)
    pairs        one sortable row per verdict, each expanding into its evidence (`kbv.report.details`)
    provenance   devices, driver, versions, precision flags, protocol versions, the secret's hash
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from kbv.metrics import FAST_P, Metrics, Rejections, standard_passes_verified_rejects
from kbv.report.details import evidence_panel
from kbv.report.figures import (
    device_peak_ratio,
    memory_ratio,
    peak_ratio,
    primary_baseline,
    speedup_interval,
    speedup_spread,
)
from kbv.report.format import categories_and_message, format_interval, format_pct, format_ratio, format_speedup
from kbv.report.leaderboard import LeaderboardRow, leaderboard
from kbv.report.markup import Markup, element, table, text
from kbv.report.plots import Plot
from kbv.report.redteam import redteam_section
from kbv.report.runs import RunSet
from kbv.verdict import Verdict

GEOMEAN_RULE = ("geometric mean, in log space, of the speedups of passing pairs; failing pairs are left out "
                "(KernelBench's rule), and n counts the speedups it averages")
PAIR_COLUMNS = ("problem", "level", "candidate", "model", "protocol", "status", "categories", "speedup",
                "peak memory", "wall s")
_PROVENANCE_KEYS = ("device_name", "device", "capability", "driver", "cuda", "torch", "triton", "python", "kbv",
                    "platform", "precision_flags", "verified_secret_sha256", "verified_seed")


def render_html(runs: RunSet, plots: Sequence[Plot], generated_at: str, redteam: Sequence[Any] = ()) -> str:
    """The whole page; `redteam` holds the judged results of the runs that are red-team runs."""
    verdicts = runs.verdicts
    metrics = runs.metrics()
    names = ", ".join(str(r.path) for r in runs.runs)
    header = element("header", element("h1", text("kbv report")),
                     element("p", text(f"{len(verdicts)} verdicts from {names}; written {generated_at}")))
    summary = _summary(metrics, standard_passes_verified_rejects(verdicts))
    body = [header, summary, _leaderboard(leaderboard(verdicts)), _plots(plots), *redteam_section(redteam),
            _pairs(runs), *_problem_failures(runs), _provenance(verdicts)]
    head = element("head", '<meta charset="utf-8">',
                   '<meta name="viewport" content="width=device-width, initial-scale=1">',
                   element("title", text(f"kbv report: {names}")), element("style", _asset("report.css")))
    page = element("html", head, element("body", element("main", *body), element("script", _asset("report.js"))),
                   lang="en")
    return "<!DOCTYPE html>\n" + page + "\n"


def _section(key: str, title: str, *content: Markup) -> Markup:
    return element("section", element("h2", text(title)), *content, id=key, data_section=key)


# -- summary -----------------------------------------------------------------------------------

def _summary(metrics: dict[str, dict[str, Metrics]], rejections: Rejections | None) -> Markup:
    if not metrics:
        return _section("summary", "Summary", element("p", text("This run holds no verdicts yet."), class_="none"))
    overall = {p: metrics[p]["all"] for p in sorted(metrics)}
    columns = [_summary_figures(m) for m in overall.values()]
    rows = [[text(name), *(text(col[i][1]) for col in columns)] for i, (name, _) in enumerate(columns[0])]
    side_by_side = table(("figure", *overall), rows, class_="summary", id="summary-table")
    rule = element("p", text(f"geomean: {GEOMEAN_RULE}. raises peak memory: the share of passing pairs whose "
                             "peak memory exceeds the baseline's by more than 10% and 1 MiB."), class_="rule")
    return _section("summary", "Summary", side_by_side, rule, *_rejections(rejections), _hacks(overall))


def _rejections(rejections: Rejections | None) -> list[Markup]:
    """What the verified protocol took back: the pairs standard passes and verified rejects, by the
    verified status (none where the run did not evaluate both protocols)."""
    if rejections is None:
        return []
    return [element("p", text(rejections.describe()), class_="rejections", id="rejections")]


def _summary_figures(m: Metrics) -> list[tuple[str, str]]:
    geomean = f"{format_speedup(m.geomean_speedup) or '-'} (n={m.speedups_counted})"
    return [("pairs", str(m.pairs)), ("skipped", str(m.skipped)), ("compile rate", format_pct(m.compile_rate)),
            ("correct rate", format_pct(m.correct_rate)),
            *((f"fast_{p:g}", format_pct(m.fast_p.get(f"fast_{p:g}"))) for p in FAST_P),
            ("geomean speedup", geomean), ("raises peak memory", format_pct(m.memory_raising_share))]


def _hacks(overall: dict[str, Metrics]) -> Markup:
    categories = sorted({c for m in overall.values() for c in m.hacks})
    if not categories:
        return element("p", text("No verdict carries a hack category."), class_="none", id="hacks")
    rows = [[text(c), *(text(overall[p].hacks.get(c, 0)) for p in overall)] for c in categories]
    return element("div", element("h3", text("Hacks by category")),
                   table(("category", *overall), rows, class_="hacks"), id="hacks")


# -- leaderboard -------------------------------------------------------------------------------

def _leaderboard(rows: list[LeaderboardRow]) -> Markup:
    headers = ("model", "pairs", "correct (standard)", "correct (verified)", "fast_1 (standard)",
               "fast_1 (verified)", "geomean (standard)", "geomean (verified)", "raises peak memory",
               "standard passes, verified rejects")
    if not rows:
        return _section("leaderboard", "Leaderboard", element("p", text("No verdicts."), class_="none"))
    bodies = []
    for row in rows:
        std, ver = row.standard, row.verified
        cells = [(row.model, row.model), (row.pairs, row.pairs),
                 _rate(std, "correct"), _rate(ver, "correct"), _rate(std, "fast_1"), _rate(ver, "fast_1"),
                 _geomean(std), _geomean(ver),
                 _share(ver.memory_raising_share if ver else None), _rejected(row.rejections)]
        bodies.append(element("tbody", element("tr", *(element("td", text(shown), data_sort=key)
                                                       for shown, key in cells))))
    return _section("leaderboard", "Leaderboard", _sortable(headers, bodies, "leaderboard-table"))


def _rate(m: Metrics | None, figure: str) -> tuple[str, object]:
    """(shown, sort key) of a rate; a protocol the model was not evaluated under shows `-`."""
    value = None if m is None else m.correct_rate if figure == "correct" else m.fast_p.get("fast_1")
    return format_pct(value), "" if value is None else value


def _geomean(m: Metrics | None) -> tuple[str, object]:
    g = m.geomean_speedup if m else None
    return (f"{format_speedup(g)} (n={m.speedups_counted})" if g is not None and m else "-", "" if g is None else g)


def _share(x: float | None) -> tuple[str, object]:
    return format_pct(x), "" if x is None else x


def _rejected(r: Rejections | None) -> tuple[str, object]:
    """`2 of 3 pairs (hack 1, incorrect 1)`, sorted by how many; `-` without both protocols."""
    return ("-", "") if r is None else (r.brief(), r.rejected)


# -- plots -------------------------------------------------------------------------------------

def _plots(plots: Sequence[Plot]) -> Markup:
    figures = [element("figure", p.svg, element("figcaption", text(f"{p.title} ({len(p.series)} series: "
                                                                   f"{', '.join(p.series) or 'none'})")),
                       data_plot=p.key, data_series=len(p.series), class_="plot") for p in plots]
    return _section("plots", "Plots", element("div", *figures, class_="plots"))


# -- pairs -------------------------------------------------------------------------------------

def _pairs(runs: RunSet) -> Markup:
    sources = runs.sources
    entries = runs.labeled()
    if not entries:
        return _section("pairs", "Pairs", element("p", text("No verdicts."), class_="none"))
    bodies = [_pair_rows(v, run, sources.get(v.candidate_hash), f"v{i}") for i, (run, v) in enumerate(entries)]
    hint = element("p", text("Click a column to sort; click a row to see its evidence."), class_="hint")
    return _section("pairs", "Pairs", hint, _sortable(PAIR_COLUMNS, bodies, "pairs-table"))


def _pair_rows(v: Verdict, run: str, source: str | None, anchor: str) -> Markup:
    ci = speedup_interval(v)
    ratio = memory_ratio(v)
    memory_title = f"allocator {format_ratio(peak_ratio(v))}, device-level {format_ratio(device_peak_ratio(v))}"
    cats = list(dict.fromkeys(c.value for c in v.categories))
    cells = [
        element("td", text(v.problem), data_sort=v.problem),
        element("td", text(v.level if v.level is not None else "-"), data_sort="" if v.level is None else v.level),
        element("td", text(v.candidate), data_sort=v.candidate),
        element("td", text(v.model or "-"), data_sort=v.model or ""),
        element("td", text(v.protocol), data_sort=v.protocol),
        element("td", text(v.status.value), class_=f"status status-{v.status.value}", data_sort=v.status.value),
        element("td", text(", ".join(cats)), data_sort=",".join(cats), title=categories_and_message(
            v.categories, v.message) or None),
        element("td", text(f"{format_speedup(v.speedup)} {format_interval(ci)}".strip() or "-"),
                data_sort="" if v.speedup is None else v.speedup, title=_spread_title(v)),
        element("td", text(format_ratio(ratio)), data_sort="" if ratio is None else ratio, title=memory_title),
        element("td", text(f"{v.wall_s:.1f}"), data_sort=v.wall_s),
    ]
    row = element("tr", *cells, class_="row", tabindex=0, aria_expanded="false", aria_controls=f"{anchor}-evidence",
                  data_anchor=anchor)
    panel = element("tr", element("td", element("p", text(f"run: {run}"), class_="run"),
                                  evidence_panel(v, source, anchor), colspan=len(PAIR_COLUMNS)),
                    class_="evidence", id=f"{anchor}-evidence", hidden=True)
    return element("tbody", row, panel, class_="verdict")


def _spread_title(v: Verdict) -> str | None:
    """A speedup of means (standard) with the spread of its trials: each side's mean ± std."""
    spread = speedup_spread(v) if v.speedup is not None else None
    if spread is None or v.timing is None:
        return None
    cand, base = v.timing.candidate, v.timing.baselines[primary_baseline(v) or ""]
    return (f"mean ± std of the trials: candidate {cand.mean_ms:.4g} ± {cand.std_ms:.2g} ms, baseline "
            f"{base.mean_ms:.4g} ± {base.std_ms:.2g} ms; the trials spread ±{100 * spread:.0f}%")


def _sortable(headers: Sequence[str], bodies: Sequence[Markup], table_id: str) -> Markup:
    """A table whose every `<tbody>` is one unit the inline script reorders when a header is clicked."""
    head = element("thead", element("tr", *(element("th", element("button", text(h), type="button"),
                                                    scope="col", aria_sort="none") for h in headers)))
    return element("table", head, *bodies, class_="sortable", id=table_id)


# -- problem failures --------------------------------------------------------------------------

def _problem_failures(runs: RunSet) -> list[Markup]:
    """The section of problems whose own code failed (none when every problem ran)."""
    failures = runs.problem_failures()
    if not failures:
        return []
    rows = [[text(f.problem), text(f.protocol), text(str(f.pairs)), text(f.message), text(run)] for run, f in failures]
    note = element("p", text("These pairs have no verdict: their problem's own code failed, or it did not fit "
                             "the device. A resumed run tries them again."))
    return [_section("problem-failures", "Problem failures", note,
                     table(("problem", "protocol", "pairs", "why", "run"), rows, class_="problem-failures"))]


# -- provenance --------------------------------------------------------------------------------

def _provenance(verdicts: Sequence[Verdict]) -> Markup:
    seen: dict[str, list[str]] = {}
    for v in verdicts:
        for key in _PROVENANCE_KEYS:
            if key in v.provenance and v.provenance[key] not in (None, ""):
                value = v.provenance[key]
                shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                seen.setdefault(key, [])
                if shown not in seen[key]:
                    seen[key].append(shown)
    versions = sorted({f"{v.protocol} {v.protocol_version}" for v in verdicts})
    rows = [[text(k), text("; ".join(seen[k]))] for k in _PROVENANCE_KEYS if k in seen]
    rows.append([text("protocol versions"), text("; ".join(versions) or "-")])
    return _section("provenance", "Provenance", table(("what", "value"), rows, class_="provenance"))


def _asset(name: str) -> str:
    return (resources.files("kbv.report") / "static" / name).read_text(encoding="utf-8")
