"""The leaderboard: one row per model, both protocols side by side, as in the seed paper's table.

Pure: verdicts in (their `model` already set to the label to group by; see `kbv.report.runs`),
`LeaderboardRow`s out, best first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kbv.metrics import Metrics, Rejections, compute_metrics, evaluated_pairs, standard_passes_verified_rejects
from kbv.verdict import Verdict

NO_MODEL = "(no model)"


@dataclass(frozen=True)
class LeaderboardRow:
    model: str
    pairs: int  # pairs evaluated (not skipped) under any protocol: each protocol's Metrics.pairs where it saw them all
    standard: Metrics | None  # None when the model has no verdict under that protocol
    verified: Metrics | None
    rejections: Rejections | None  # pairs passing standard and failing verified; None without both protocols


def leaderboard(verdicts: Sequence[Verdict]) -> list[LeaderboardRow]:
    """One row per `verdict.model` (None reads as NO_MODEL), ranked by verified fast_1, then the
    verified geomean, then the standard fast_1."""
    by_model: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_model[v.model or NO_MODEL].append(v)
    rows = [_row(model, group) for model, group in by_model.items()]
    return sorted(rows, key=_rank)


def _row(model: str, verdicts: list[Verdict]) -> LeaderboardRow:
    by_protocol: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_protocol[v.protocol].append(v)
    return LeaderboardRow(
        model=model, pairs=evaluated_pairs(verdicts),
        standard=compute_metrics(by_protocol["standard"]) if by_protocol.get("standard") else None,
        verified=compute_metrics(by_protocol["verified"]) if by_protocol.get("verified") else None,
        rejections=standard_passes_verified_rejects(verdicts))


def _rank(row: LeaderboardRow) -> tuple[float, float, float, str]:
    ver, std = row.verified, row.standard
    return (-(ver.fast_p.get("fast_1", 0.0) if ver else -1.0),
            -((ver.geomean_speedup or 0.0) if ver else -1.0),
            -(std.fast_p.get("fast_1", 0.0) if std else -1.0),
            row.model)
