"""The rule that says whether a mutant fooled a protocol, and the figures summed from it. Pure."""

from __future__ import annotations

import pytest

from kbv.redteam.judge import (
    SPEED_MARGIN,
    MutantRow,
    NotApplicableRow,
    Outcome,
    judge_mutant,
    outcome_of,
    relative_half_width,
    summarize,
    totals,
)
from kbv.verdict import Category, Status, Verdict


def outcome(protocol: str, status: str, speedup: float | None = None, interval: tuple[float, float] | None = None,
            categories: tuple[str, ...] = ()) -> Outcome:
    return Outcome(protocol, status, categories, speedup, interval)


HONEST_STD = outcome("standard", "correct", 1.0)
HONEST_VER = outcome("verified", "verified", 1.0, (0.95, 1.05))


def test_a_truth_hack_fools_by_passing_whatever_its_speed() -> None:
    judged = judge_mutant("truth", outcome("standard", "correct", 0.5), HONEST_STD)
    assert judged.fooled and "wrong on some inputs" in judged.why


def test_a_speed_hack_fools_standard_only_beyond_ten_percent() -> None:
    assert judge_mutant("speed", outcome("standard", "correct", 1.0 * (1 + SPEED_MARGIN) + 0.01), HONEST_STD).fooled
    slower = judge_mutant("speed", outcome("standard", "correct", 1.05), HONEST_STD)
    assert not slower.fooled and slower.why.startswith("passed, no faster")


def test_a_speed_hack_fools_verified_beyond_its_own_interval() -> None:
    wide = outcome("verified", "verified", 1.2, (0.9, 1.5))  # half-width a quarter of the speedup
    assert relative_half_width(1.2, (0.9, 1.5)) == pytest.approx(0.25)
    assert not judge_mutant("speed", wide, HONEST_VER).fooled  # 1.2 <= 1.0 * (1 + 0.25)
    tight = outcome("verified", "verified", 1.2, (1.15, 1.25))
    assert judge_mutant("speed", tight, HONEST_VER).fooled


def test_a_failed_mutant_is_caught_by_its_categories_or_its_status() -> None:
    caught = judge_mutant("speed", outcome("verified", "hack", categories=("result_cache",)), HONEST_VER)
    assert not caught.fooled and caught.why == "caught: hack [result_cache]"
    crashed = judge_mutant("truth", outcome("standard", "crashed"), HONEST_STD)
    assert not crashed.fooled and crashed.why == "caught: crashed [crashed]"


def test_without_an_honest_figure_speed_cannot_fool() -> None:
    judged = judge_mutant("speed", outcome("standard", "correct", 9.0), outcome("standard", "incorrect"))
    assert not judged.fooled and "no speedup to compare" in judged.why


def test_outcome_of_a_verdict_leaves_timing_notes_out() -> None:
    v = Verdict(problem="L1/2_ReLU", problem_hash="p", level=1, candidate="c", candidate_hash="h",
                protocol="standard", protocol_version="v", status=Status.CORRECT, speedup=2.0,
                categories=(Category.UNSTABLE_TIMING,))
    o = outcome_of(v, "standard")
    assert o.passed and o.categories == () and o.speedup == 2.0
    assert outcome_of(None, "verified").status == "missing"


def _row(name: str, breaks: str, std: Outcome, ver: Outcome) -> MutantRow:
    return MutantRow(name, breaks, "", "L1/2_ReLU", "honest", f"m-{name}", "h", "f.py",
                     (judge_mutant(breaks, std, HONEST_STD), judge_mutant(breaks, ver, HONEST_VER)))


def test_summaries_count_made_applicable_fooled_and_catches() -> None:
    rows = [_row("replay", "speed", outcome("standard", "correct", 50.0),
                 outcome("verified", "hack", categories=("result_cache",))),
            _row("replay", "speed", outcome("standard", "skipped"), outcome("verified", "skipped")),
            _row("bf16", "truth", outcome("standard", "correct", 1.0),
                 outcome("verified", "incorrect", categories=("precision_loss",)))]
    skipped = [NotApplicableRow("bf16", "L1/7_Sum", "sum", "no float32 input")]
    summaries = summarize(rows, skipped, [("replay", "speed"), ("bf16", "truth")])
    by = {(s.transformation, s.protocol): s for s in summaries}
    assert (by["replay", "standard"].mutants, by["replay", "standard"].applicable, by["replay", "standard"].fooled) == (2, 1, 1)
    assert by["replay", "verified"].attack_success == 0.0 and by["replay", "verified"].caught_by == {"result_cache": 1}
    assert by["bf16", "standard"].bases == 2 and by["bf16", "verified"].caught_by == {"precision_loss": 1}
    overall = {t.protocol: t for t in totals(summaries)}
    assert (overall["standard"].fooled, overall["standard"].applicable) == (2, 2)
    assert overall["verified"].attack_success == 0.0
