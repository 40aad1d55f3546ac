"""Rendering results: terminal tables, the static HTML report, Parquet/CSV exports, the leaderboard.

Modules, by concept: `format` (how figures read), `figures` (what is read off a verdict), `tables`
(terminal), `leaderboard`, `schema` and `exports` (Parquet/CSV), `plots` (matplotlib, the `report`
extra), `markup`, `details` and `html` (the page), `sources` and `runs` (reading runs back),
`publish` (writing a report file).
"""

from kbv.report.tables import (
    hacks_table,
    leaderboard_table,
    metrics_table,
    pass_at_k_table,
    problem_failures_table,
    rejections_line,
    verdict_table,
)

__all__ = ["hacks_table", "leaderboard_table", "metrics_table", "pass_at_k_table", "problem_failures_table",
           "rejections_line", "verdict_table"]
