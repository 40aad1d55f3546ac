"""The report's plots, drawn with matplotlib (the `report` extra) into SVG strings.

Each plot is a `Plot`: its SVG and the names of its series. Every series' artists carry the SVG id
`<plot key>-series-<i>[-<j>]`, so a reader (or a test) can count what was drawn. matplotlib is imported
here only, through its object-oriented API (no pyplot, no global figure state); rc settings are scoped
to each drawing.

    fast_p      fast_p as a curve of p in [0, 4], one line per (model, protocol)
    speedups    the distribution of passed speedups on a log scale, one outline per protocol
    agreement   standard vs verified speedup per pair (log-log, y = x drawn), hacks by category
    memory      verified speedup vs peak-memory ratio, the faster-and-leaner quadrant shaded
    levels      per level: correct rate and fast_1 under each protocol
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kbv.errors import UsageError
from kbv.metrics import Metrics
from kbv.report.figures import memory_ratio
from kbv.verdict import Verdict, hack_categories

P_GRID = tuple(i / 20 for i in range(81))  # p from 0 to 4 in steps of 0.05
PROTOCOL_STYLE = {"standard": "--", "verified": "-"}
_FLOOR = 1e-3  # log axes: smaller values are drawn at the floor


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    svg: str
    series: tuple[str, ...]  # names, in the order of the `-series-<i>` ids


# -- the data each plot draws (pure) ------------------------------------------------------------

def fast_p_curve(verdicts: Sequence[Verdict], grid: Sequence[float] = P_GRID) -> list[float]:
    """fast_p at each p of `grid`: the share of counted pairs that passed with speedup > p."""
    counted = [v for v in verdicts if v.status.counted]
    speeds = [v.speedup for v in counted if v.status.passed and v.speedup is not None]
    return [sum(1 for s in speeds if s > p) / len(counted) if counted else 0.0 for p in grid]


def by_model_and_protocol(verdicts: Sequence[Verdict]) -> dict[tuple[str, str], list[Verdict]]:
    groups: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[(v.model or "", v.protocol)].append(v)
    return dict(sorted(groups.items()))


def agreement_points(verdicts: Sequence[Verdict]) -> dict[str, list[tuple[float, float | None]]]:
    """{group: [(standard speedup, verified speed or None)]} over pairs that passed the standard
    protocol and have a verified verdict. The group is "verified" for a verified pass, the first hack
    category of a hack, else "failed verified"; the verified speed of a failure is the one it was
    timed at, where it was timed."""
    pairs: dict[tuple[Any, ...], dict[str, Verdict]] = defaultdict(dict)
    for v in verdicts:
        pairs[(v.problem, v.candidate, v.candidate_hash, v.model, v.sample)][v.protocol] = v
    groups: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for pair in pairs.values():
        std, ver = pair.get("standard"), pair.get("verified")
        if std is None or ver is None or std.speedup is None or not std.status.passed:
            continue
        hacks = hack_categories(ver.categories)
        group = "verified" if ver.status.passed else hacks[0].value if hacks else "failed verified"
        groups[group].append((std.speedup, ver.speedup if ver.speedup is not None else _timed_speedup(ver)))
    return dict(sorted(groups.items(), key=lambda kv: (kv[0] != "verified", kv[0])))


def memory_points(verdicts: Sequence[Verdict]) -> dict[str, list[tuple[float, float]]]:
    """{model: [(peak-memory ratio, verified speedup)]} over verified passes with both figures."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for v in verdicts:
        ratio = memory_ratio(v)
        if v.protocol == "verified" and v.status.passed and v.speedup is not None and ratio is not None:
            points[v.model or ""].append((ratio, v.speedup))
    return dict(sorted(points.items()))


def _timed_speedup(v: Verdict) -> float | None:
    if v.timing is None or not v.timing.speedups:
        return None
    value = next(iter(v.timing.speedups.values()))
    return value if value > 0 and math.isfinite(value) else None


# -- drawing -----------------------------------------------------------------------------------

def draw_plots(verdicts: Sequence[Verdict], metrics: dict[str, dict[str, Metrics]]) -> list[Plot]:
    """Every plot of the report, in order. Raises UsageError when matplotlib is missing."""
    _matplotlib()
    return [draw_fast_p(verdicts), draw_speedups(verdicts), draw_agreement(verdicts), draw_memory(verdicts),
            draw_levels(metrics)]


def draw_fast_p(verdicts: Sequence[Verdict]) -> Plot:
    groups = by_model_and_protocol(verdicts)
    models = sorted({m for m, _ in groups})

    def draw(ax: Any) -> list[str]:
        names = []
        for i, ((model, protocol), group) in enumerate(groups.items()):
            (line,) = ax.plot(P_GRID, fast_p_curve(group), PROTOCOL_STYLE.get(protocol, ":"),
                              color=_color(models.index(model)), label=f"{model or '-'} ({protocol})")
            line.set_gid(f"fast_p-series-{i}")
            names.append(line.get_label())
        ax.set(xlabel="p (speedup threshold)", ylabel="fast_p (share of all pairs)", xlim=(0, 4), ylim=(0, 1.02))
        return names

    return _plot("fast_p", "fast_p against p, per model and protocol", draw)


def draw_speedups(verdicts: Sequence[Verdict]) -> Plot:
    speeds: dict[str, list[float]] = defaultdict(list)
    for v in verdicts:
        if v.status.passed and v.speedup is not None and v.speedup > 0:
            speeds[v.protocol].append(max(v.speedup, _FLOOR))

    def draw(ax: Any) -> list[str]:
        every = [s for group in speeds.values() for s in group]
        if not every:
            return []
        low, high = math.floor(math.log10(min(every))), math.ceil(math.log10(max(every)))
        bins = [10 ** (low + k * (high - low + 1e-9) / 30) for k in range(31)]
        names = []
        for i, (protocol, group) in enumerate(sorted(speeds.items())):
            _, _, patches = ax.hist(group, bins=bins, histtype="step", linewidth=1.8,
                                    linestyle=PROTOCOL_STYLE.get(protocol, ":"), color=_color(i),
                                    label=f"{protocol} (n={len(group)})")
            for j, patch in enumerate(patches):
                patch.set_gid(f"speedups-series-{i}-{j}")
            names.append(protocol)
        ax.set_xscale("log")
        ax.axvline(1.0, color="0.5", linewidth=0.8)
        ax.set(xlabel="speedup over the protocol's baseline (log)", ylabel="pairs")
        return names

    return _plot("speedups", "Distribution of speedups of passing pairs", draw)


def draw_agreement(verdicts: Sequence[Verdict]) -> Plot:
    groups = agreement_points(verdicts)

    def draw(ax: Any) -> list[str]:
        xs = [x for pts in groups.values() for x, _ in pts]
        ys = [y for pts in groups.values() for _, y in pts if y is not None]
        if not xs:
            return []
        low = min(min(xs + ys), 1.0) / 2
        high = max(max(xs + ys), 1.0) * 2
        bottom = low * 0.7  # failures timed at no speed sit on this line
        ax.plot([low, high], [low, high], color="0.4", linewidth=1, linestyle=":", label="y = x")
        names = []
        for i, (group, pts) in enumerate(groups.items()):
            marker = "o" if group == "verified" else "x" if group == "failed verified" else "^"
            scatter = ax.scatter([max(x, _FLOOR) for x, _ in pts],
                                 [max(y, _FLOOR) if y is not None else bottom for _, y in pts],
                                 marker=marker, color=_color(i), s=36, label=f"{group} ({len(pts)})")
            scatter.set_gid(f"agreement-series-{i}")
            names.append(group)
        ax.axhline(bottom, color="0.8", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(bottom * 0.8, high),
               xlabel="standard speedup (log)", ylabel="verified speedup (log; bottom line: not timed)")
        return names

    return _plot("agreement", "Standard against verified speedup, per pair", draw)


def draw_memory(verdicts: Sequence[Verdict]) -> Plot:
    groups = memory_points(verdicts)
    models = sorted(groups)

    def draw(ax: Any) -> list[str]:
        every = [p for pts in groups.values() for p in pts]
        if not every:
            return []
        x_low = min(min(max(r, _FLOOR) for r, _ in every), 1.0) / 2
        x_high = max(max(r for r, _ in every), 1.0) * 2
        y_low = min(min(s for _, s in every), 1.0) / 2
        y_high = max(max(s for _, s in every), 1.0) * 2
        ax.fill_between([x_low, 1.0], 1.0, y_high, color="#2ca02c", alpha=0.12, linewidth=0,
                        label="faster and leaner")
        names = []
        for i, model in enumerate(models):
            pts = groups[model]
            scatter = ax.scatter([max(r, _FLOOR) for r, _ in pts], [s for _, s in pts], color=_color(i), s=36,
                                 label=f"{model or '-'} ({len(pts)})")
            scatter.set_gid(f"memory-series-{i}")
            names.append(model)
        ax.axvline(1.0, color="0.5", linewidth=0.8)
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlim=(x_low, x_high), ylim=(y_low, y_high),
               xlabel="peak memory, candidate / baseline (log)", ylabel="verified speedup (log)")
        return names

    return _plot("memory", "Verified speedup against peak-memory ratio", draw)


def draw_levels(metrics: dict[str, dict[str, Metrics]]) -> Plot:
    levels = sorted({g for groups in metrics.values() for g in groups if g != "all"})
    bars = [(f"{figure} ({protocol})", protocol, figure) for protocol in sorted(metrics)
            for figure in ("correct", "fast_1")]

    def draw(ax: Any) -> list[str]:
        if not levels:
            return []
        width = 0.8 / len(bars)
        names = []
        for i, (name, protocol, figure) in enumerate(bars):
            values = [_level_value(metrics[protocol].get(level), figure) for level in levels]
            container = ax.bar([k + (i - (len(bars) - 1) / 2) * width for k in range(len(levels))], values,
                               width=width, color=_color(i), hatch="//" if protocol == "standard" else None,
                               label=name)
            for j, patch in enumerate(container.patches):
                patch.set_gid(f"levels-series-{i}-{j}")
            names.append(name)
        ax.set_xticks(range(len(levels)), levels)
        ax.set(ylim=(0, 1.05), ylabel="share of the level's pairs")
        return names

    return _plot("levels", "Per level: correct rate and fast_1", draw)


def _level_value(m: Metrics | None, figure: str) -> float:
    if m is None:
        return 0.0
    return m.correct_rate if figure == "correct" else m.fast_p.get("fast_1", 0.0)


def _plot(key: str, title: str, draw: Callable[[Any], list[str]]) -> Plot:
    """Run `draw(axes)` on a fresh figure and keep it as SVG; a plot with nothing to draw says so."""
    matplotlib = _matplotlib()
    from matplotlib.figure import Figure

    with _svg_settings(matplotlib, key):
        fig = Figure(figsize=(6.4, 4.0), dpi=100)
        ax = fig.add_subplot()
        names = draw(ax)
        if names:
            ax.legend(fontsize=8, loc="best")
            ax.grid(True, which="major", alpha=0.3)
        else:
            ax.set_axis_off()
            ax.text(0.5, 0.5, "nothing to plot: no verdict has these figures", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})  # no timestamp: the same run, the same file
    svg = buffer.getvalue()
    return Plot(key, title, svg[svg.index("<svg"):], tuple(names))  # without the XML prolog and doctype


@contextmanager
def _svg_settings(matplotlib: Any, key: str) -> Iterator[None]:
    # Text as text (smaller, selectable). A fixed hash salt gives the same file for the same run; one
    # salt per plot keeps the clip-path and marker ids of the plots on one page apart (a clash would
    # clip one plot by another's rectangle).
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"kbv-{key}", "font.size": 9}):
        yield


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")
    return palette[i % len(palette)]


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise UsageError("The HTML report's plots need matplotlib: pip install 'kernelbench-verified[report]'") from exc
    return matplotlib
