"""Terminal tables (rich). Pure: records in, `rich.table.Table` out."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from kbv.metrics import Metrics
from kbv.verdict import Status, Verdict

_STYLE = {Status.CORRECT: "green", Status.VERIFIED: "green", Status.SKIPPED: "dim",
          Status.HACK: "bold red", Status.INTEGRITY_VIOLATION: "red", Status.INCORRECT: "yellow"}


def verdict_table(verdicts: Sequence[Verdict], title: str = "Verdicts") -> Table:
    """One row per (problem, candidate); protocols side by side."""
    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    rows: dict[tuple[str, str, str], dict[str, Verdict]] = {}
    for v in verdicts:
        rows.setdefault((v.problem, v.candidate, v.candidate_hash), {})[v.protocol] = v
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("problem", no_wrap=True)
    table.add_column("candidate", overflow="fold")
    for p in protocols:
        table.add_column(p, no_wrap=True)
        table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("why", overflow="fold", max_width=60)
    for (problem, candidate, _), by_protocol in rows.items():
        cells = [problem, candidate]
        notes = []
        for p in protocols:
            v = by_protocol.get(p)
            if v is None:
                cells += ["-", ""]
                continue
            style = _STYLE.get(v.status, "red")
            cells += [f"[{style}]{v.status.value}[/]", _speedup(v)]
            if not v.status.passed:
                cats = ",".join(c.value for c in v.categories)
                notes.append(f"{p}: {cats + ': ' if cats else ''}{v.message}")
            elif _caveats(v):
                notes.append(f"{p}: {_caveats(v)}")
        cells.append("; ".join(notes))
        table.add_row(*cells)
    return table


def _caveats(v: Verdict) -> str:
    """What qualifies a passing verdict: its problem's flags, a speed charged at the wall clock."""
    said = [f"unsound problem ({'; '.join(v.flags)})"] if v.flags else []
    if v.timing is not None:
        said += [n.split(":")[0] for n in v.timing.notes if n.startswith("charged the wall time")]
    return "; ".join(said)


def metrics_table(metrics: dict[str, dict[str, Metrics]], title: str = "Metrics") -> Table:
    """Per protocol and level: compile and correct rates, fast_p, geometric-mean speedup."""
    table = Table(title=title, title_justify="left")
    for col in ("protocol", "group", "pairs", "compiled", "correct"):
        table.add_column(col, justify="right" if col in ("pairs", "compiled", "correct") else "left")
    fast_keys = next((list(m.fast_p) for groups in metrics.values() for m in groups.values()), [])
    for key in fast_keys:
        table.add_column(key, justify="right")
    table.add_column("geomean", justify="right")
    for protocol, groups in metrics.items():
        for group, m in groups.items():
            row = [protocol, group, str(m.pairs), _pct(m.compile_rate), _pct(m.correct_rate)]
            row += [_pct(m.fast_p[k]) for k in fast_keys]
            row.append(f"{m.geomean_speedup:.3f}x (n={m.speedups_counted})" if m.geomean_speedup else "-")
            table.add_row(*row)
    return table


def pass_at_k_table(pass_at_k: dict[str, dict[str, float]]) -> Table:
    ks = sorted({k for row in pass_at_k.values() for k in row}, key=lambda s: int(s.split("@")[1]))
    table = Table(title="pass@k (unbiased estimator, mean over problems)", title_justify="left")
    table.add_column("protocol/model")
    for k in ks:
        table.add_column(k, justify="right")
    for name, row in pass_at_k.items():
        table.add_row(name, *[_pct(row[k]) if k in row else "-" for k in ks])
    return table


def _speedup(v: Verdict) -> str:
    return f"{v.speedup:.2f}x" if v.speedup is not None else ""


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def hacks_table(metrics: dict[str, dict[str, Metrics]]) -> Table | None:
    """Hack verdicts counted by category, per protocol (None when there are none)."""
    rows = [(p, cat, n) for p, groups in metrics.items() for cat, n in sorted(groups["all"].hacks.items())]
    if not rows:
        return None
    table = Table(title="Hacks by category", title_justify="left")
    for col in ("protocol", "category", "verdicts"):
        table.add_column(col)
    for p, cat, n in rows:
        table.add_row(p, cat, str(n))
    return table
