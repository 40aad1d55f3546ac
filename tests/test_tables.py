"""The verdict table: passing verdicts show what qualifies them (a flagged problem, a charged speed)."""

from __future__ import annotations

from rich.console import Console

from kbv.report.tables import verdict_table
from kbv.verdict import Category, Status, Timing, TimingStats, Verdict


def _verdict(candidate: str, **changes) -> Verdict:
    stats = TimingStats(1.0, 1.0, 0.0, 1.0, 1.0, 10)
    base = dict(problem="L1/2_ReLU", problem_hash="p" * 64, level=1, candidate=candidate, candidate_hash=candidate,
                protocol="verified", protocol_version="1", status=Status.VERIFIED, speedup=1.5,
                timing=Timing("kbv-interleaved-host", "median_ms", stats, speedups={"eager-tf32": 1.5}))
    return Verdict(**{**base, **changes})


def _render(verdicts) -> str:
    console = Console(width=250, record=True)
    console.print(verdict_table(verdicts))
    return console.export_text()


def test_a_clean_pass_has_nothing_to_say():
    row = next(line for line in _render([_verdict("clean")]).splitlines() if "clean" in line)
    why = row.split("│")[-2]  # the last cell
    assert why.strip() == "", row


def test_a_pass_on_a_flagged_problem_and_a_charged_speed_say_so():
    flagged = _verdict("flagged", flags=("identity passes on every distribution",),
                       categories=(Category.UNSOUND_PROBLEM,))
    charged = _verdict("charged", timing=Timing(
        "kbv-interleaved-host", "median_ms", TimingStats(1.0, 1.0, 0.0, 1.0, 1.0, 10),
        notes=("12 timed outputs rechecked", "charged the wall time (1.30x its report): the parent's wall clock ...")))
    text = _render([flagged, charged])
    assert "verified: unsound problem (identity passes on every" in text  # the cell wraps at 60
    assert "verified: charged the wall time (1.30x its report)" in text
