"""The evidence panel of one verdict, as the HTML report shows it when its row is expanded.

Pure: a verdict (and its candidate's source, where found) in, markup out. Sections, in order: what it
says, correctness per distribution against what was allowed, integrity and guards, attribution,
timing, memory, static findings over the highlighted source, and any evidence not shown above.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kbv.report.figures import peak_ratio, primary_baseline, speedup_interval
from kbv.report.format import format_bytes, format_interval, format_pct, format_ratio, format_speedup
from kbv.report.markup import Markup, definition_list, element, table, text
from kbv.verdict import Finding, Trial, Verdict

# evidence keys shown in their own sections; every other key goes under "other evidence"
_SHOWN = {"integrity", "hacks", "notes", "state_loaded", "attribution", "timing_findings"}


def evidence_panel(v: Verdict, source: str | None, anchor: str) -> Markup:
    """The panel of `v`; `anchor` prefixes the ids of its highlighted source lines."""
    sections = [
        _section("Verdict", definition_list([("status", text(v.status.value)), ("message", text(v.message or "-")),
                                             ("flags", text("; ".join(v.flags) or "-"))])),
        _section("Correctness per distribution", _trials(v.trials)),
        _section("Integrity and guards", _integrity(v)),
        _section("Attribution", _attribution(v.evidence.get("attribution"))),
        _section("Timing", _timing(v)),
        _section("Memory", _memory(v)),
        _section("Static findings", _findings(v.findings, source, anchor)),
        _section("Other evidence", _other(v.evidence)),
    ]
    return element("div", *sections, class_="evidence-panel")


def _section(title: str, body: Markup) -> Markup:
    return element("section", element("h4", text(title)), body, class_="evidence-section",
                   data_section=title.lower().split()[0])


def _none(what: str) -> Markup:
    return element("p", text(what), class_="none")


def _trials(trials: Sequence[Trial]) -> Markup:
    if not trials:
        return _none("no correctness trial ran")
    rows = [[text(t.distribution), text(t.index), _passed(t.passed), text(_sci(t.candidate_err)),
             text(_sci(t.allowed_err)), text(_sci(t.baseline_err)), text(_sci(t.max_abs_err)),
             text(t.category.value if t.category else ""), text(t.note)] for t in trials]
    headers = ("distribution", "trial", "passed", "error", "allowed", "baseline's error", "max abs error",
               "category", "note")
    return table(headers, rows, class_="trials")


def _integrity(v: Verdict) -> Markup:
    items = []
    for key in ("integrity", "hacks"):
        found = v.evidence.get(key)
        if isinstance(found, dict) and found:
            items += [(f"{key}: {cat}", text(why)) for cat, why in found.items()]
    notes = v.evidence.get("notes")
    if isinstance(notes, list) and notes:
        items.append(("notes", element("ul", *(element("li", text(n)) for n in notes))))
    if "state_loaded" in v.evidence:
        items.append(("state loaded", text(v.evidence["state_loaded"] if v.evidence["state_loaded"] is not None else "-")))
    return definition_list(items) if items else _none("no integrity or guard finding")


def _attribution(attribution: Any) -> Markup:
    if not isinstance(attribution, dict):
        return _none("not measured (the verified protocol attributes device time after correctness)")
    share = attribution.get("custom_share")
    items = [("custom share", text(format_pct(share) if isinstance(share, (int, float)) else "-")),
             ("custom launches", text(attribution.get("custom_launches", "-"))),
             ("launches", text(attribution.get("launches", "-"))),
             ("ghost replay", text(attribution.get("ghost_replay", "-")))]
    kernels = attribution.get("kernels") or []
    rows = [[text(k.get("name")), text(k.get("us")), text("yes" if k.get("custom") else "no")]
            for k in kernels if isinstance(k, dict)]
    top = table(("kernel", "device time (us)", "custom"), rows, class_="kernels") if rows else ""
    return definition_list(items) + top


def _timing(v: Verdict) -> Markup:
    findings = v.evidence.get("timing_findings") or []
    listed = element("ul", *(element("li", text(f)) for f in findings)) if findings else ""
    if v.timing is None:
        return listed or _none("not timed")
    t = v.timing
    primary = primary_baseline(v)
    items = [("method", text(f"{t.method}, by {t.statistic}")),
             ("candidate", text(_stats(t.candidate))),
             *((f"baseline {name}" + (" (primary)" if name == primary else ""), text(_stats(stats)))
               for name, stats in t.baselines.items()),
             *((f"speedup over {name}", text(f"{format_speedup(s)} {format_interval(t.speedup_ci.get(name))}".strip()))
               for name, s in t.speedups.items())]
    ci = speedup_interval(v)
    if ci:
        items.append(("interval", text(format_interval(ci))))
    if t.notes:
        items.append(("notes", element("ul", *(element("li", text(n)) for n in t.notes))))
    return definition_list(items) + listed


def _memory(v: Verdict) -> Markup:
    if v.memory is None:
        return _none("not measured")
    items = [("candidate peak", text(format_bytes(v.memory.peak_bytes))),
             ("candidate retained", text(format_bytes(v.memory.retained_bytes))),
             ("candidate device-level peak", text(format_bytes(v.memory.device_peak_bytes))),
             ("candidate device memory outside PyTorch", text(format_bytes(v.memory.device_raw_bytes)))]
    if v.baseline_memory is not None:
        items += [("baseline peak", text(format_bytes(v.baseline_memory.peak_bytes))),
                  ("baseline device-level peak", text(format_bytes(v.baseline_memory.device_peak_bytes))),
                  ("peak ratio", text(format_ratio(peak_ratio(v))))]
    return definition_list(items)


def _findings(findings: Sequence[Finding], source: str | None, anchor: str) -> Markup:
    if not findings:
        return _none("the static scan found nothing")
    rows = [[text(f.rule), element("span", text(f.severity), class_=f"severity-{f.severity}"),
             text(f.category.value), _line_link(f.line, anchor, source is not None), text(f.message)]
            for f in findings]
    listing = table(("rule", "severity", "category", "line", "message"), rows, class_="findings")
    if source is None:
        return listing + _none("the candidate's source was not found where the run read it (moved or edited)")
    return listing + _source(source, findings, anchor)


def _line_link(line: int | None, anchor: str, linked: bool) -> Markup:
    if line is None:
        return text("-")
    return element("a", text(line), href=f"#{anchor}-L{line}") if linked else text(line)


def _source(source: str, findings: Sequence[Finding], anchor: str) -> Markup:
    """The source with line numbers; lines with findings are highlighted and titled with them."""
    hits: dict[int, list[str]] = {}
    for f in findings:
        if f.line is not None:
            hits.setdefault(f.line, []).append(f"{f.rule} {f.category.value}: {f.message}")
    lines = []
    for number, line in enumerate(source.splitlines(), start=1):
        said = hits.get(number)
        lines.append(element("span", element("span", text(number), class_="ln"), text(line) + "\n",
                             class_="line hit" if said else "line", id=f"{anchor}-L{number}",
                             title="; ".join(said) if said else None))
    return element("pre", element("code", *lines), class_="source")


def _other(evidence: dict[str, Any]) -> Markup:
    rest = {k: v for k, v in evidence.items() if k not in _SHOWN}
    if not rest:
        return _none("nothing else")
    items = []
    for key, value in rest.items():
        shown = value if isinstance(value, str) else json.dumps(value, indent=1, sort_keys=True, default=str)
        items.append((key, element("pre", text(shown))))
    return definition_list(items)


def _passed(ok: bool) -> Markup:
    return element("span", text("yes" if ok else "no"), class_="ok" if ok else "bad")


def _sci(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def _stats(s: Any) -> str:
    """Centre and spread of one side's timed calls: median, mean ± std, the range, n, the CI."""
    ci = f", CI [{s.ci_low_ms:.4g}, {s.ci_high_ms:.4g}] ms" if s.ci_low_ms is not None and s.ci_high_ms is not None else ""
    host = f", host {s.host_ms:.4g} ms a call" if getattr(s, "host_ms", None) is not None else ""
    return (f"median {s.median_ms:.4g} ms, mean {s.mean_ms:.4g} ± {s.std_ms:.2g} ms (std), "
            f"range {s.min_ms:.4g}-{s.max_ms:.4g} ms, n={s.n}{ci}{host}")
