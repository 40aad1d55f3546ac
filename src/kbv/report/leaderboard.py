"""The leaderboard: one row per model, both protocols side by side, as in the seed paper's table.

Pure: verdicts in (their `model` already set to the label to group by; see `kbv.report.runs`),
`LeaderboardRow`s out, best first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kbv.metrics import Metrics, compute_metrics
from kbv.verdict import Verdict, hack_categories

NO_MODEL = "(no model)"


@dataclass(frozen=True)
class LeaderboardRow:
    model: str
    pairs: int  # distinct (problem, candidate, sample) under any protocol
    standard: Metrics | None  # None when the model has no verdict under that protocol
    verified: Metrics | None
    hacks_caught: int  # pairs with a hack category under any protocol
    passed_standard_only: int  # pairs correct under the standard protocol and not verified


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
    by_pair: dict[tuple[object, ...], dict[str, Verdict]] = defaultdict(dict)
    for v in verdicts:
        by_protocol[v.protocol].append(v)
        by_pair[_pair(v)][v.protocol] = v
    hacked = sum(1 for pair in by_pair.values() if any(hack_categories(v.categories) for v in pair.values()))
    standard_only = sum(1 for pair in by_pair.values()
                        if "standard" in pair and "verified" in pair
                        and pair["standard"].status.passed and not pair["verified"].status.passed)
    return LeaderboardRow(
        model=model, pairs=len(by_pair),
        standard=compute_metrics(by_protocol["standard"]) if by_protocol.get("standard") else None,
        verified=compute_metrics(by_protocol["verified"]) if by_protocol.get("verified") else None,
        hacks_caught=hacked, passed_standard_only=standard_only)


def _pair(v: Verdict) -> tuple[object, ...]:
    return (v.problem, v.candidate, v.candidate_hash, v.sample)


def _rank(row: LeaderboardRow) -> tuple[float, float, float, str]:
    ver, std = row.verified, row.standard
    return (-(ver.fast_p.get("fast_1", 0.0) if ver else -1.0),
            -((ver.geomean_speedup or 0.0) if ver else -1.0),
            -(std.fast_p.get("fast_1", 0.0) if std else -1.0),
            row.model)
