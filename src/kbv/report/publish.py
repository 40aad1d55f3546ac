"""Writing a report file: `write_report(runs, fmt, out)` for html, csv and parquet.

The one function the CLI calls for files: read the runs, build the page or the rows, write them where
asked (by default into the first run's directory), and say where.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbv.errors import UsageError
from kbv.report.runs import load_runs

FILE_FORMATS = ("html", "csv", "parquet")
DEFAULT_NAMES = {"html": "report.html", "csv": "verdicts.csv", "parquet": "verdicts.parquet"}


@dataclass(frozen=True)
class Written:
    path: Path
    verdicts: int
    runs: int


def write_report(runs: Sequence[str], fmt: str, out: str | None = None) -> Written:
    """Write the `fmt` report of `runs` to `out` (default: DEFAULT_NAMES[fmt] in the first run).

    Raises StoreError for a path without a run; UsageError for an unknown format, an unwritable
    path, or a missing optional dependency (matplotlib for html, pyarrow for parquet)."""
    if fmt not in FILE_FORMATS:
        raise UsageError(f"Unknown file format '{fmt}': expected {', '.join(FILE_FORMATS)}.")
    loaded = load_runs(runs, with_sources=fmt == "html")
    path = Path(out) if out else Path(runs[0]) / DEFAULT_NAMES[fmt]
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory; name the file to write.")
    if fmt == "html":
        from kbv.report.html import render_html
        from kbv.report.plots import draw_plots

        page = render_html(loaded, draw_plots(loaded.verdicts, loaded.metrics()), time.strftime("%Y-%m-%d %H:%M"),
                           redteam_results(runs))
        _write_text(path, page)
    else:
        from kbv.report.exports import write_csv, write_parquet
        from kbv.report.schema import verdict_row

        rows = [verdict_row(v, run) for run, v in loaded.stored()]
        (write_csv if fmt == "csv" else write_parquet)(rows, path)
    return Written(path, len(loaded.verdicts), len(loaded.runs))


def redteam_results(runs: Sequence[str]) -> list[Any]:
    """The judged red-team results of those `runs` that `kbv redteam` made (`kbv.redteam.run`)."""
    from kbv.redteam.run import MANIFEST, load_result

    return [load_result(run) for run in runs if (Path(run) / MANIFEST).is_file()]


def _write_text(path: Path, content: str) -> None:
    try:
        path.write_text(content, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write {path}: {exc.strerror or exc}") from exc
