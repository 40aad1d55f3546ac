"""The leaderboard: one row per model across runs, both protocols, ranked; and models named where
the run recorded none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kbv.metrics import Rejections
from kbv.report.leaderboard import NO_MODEL, leaderboard
from kbv.report.runs import load_runs
from kbv.verdict import Category, Status
from records import GOLDEN, SAMPLE, verdict, write_run


def test_one_row_per_model_with_golden_figures() -> None:
    rows = {r.model: r for r in leaderboard(SAMPLE)}
    assert list(rows) == ["model-a", "model-b"]  # ranked by verified fast_1: 1/3 against 0
    a, b = rows["model-a"], rows["model-b"]
    assert a.pairs == 3 and a.rejections == Rejections(3, 2, {"hack": 1, "incorrect": 1})
    assert a.standard.correct_rate == 1.0 and a.verified.correct_rate == pytest.approx(1 / 3)
    assert a.standard.geomean_speedup == pytest.approx((1.8 * 40 * 2) ** (1 / 3))
    assert a.verified.geomean_speedup == pytest.approx(1.5) and a.verified.memory_raising_share == 0.0
    assert b.pairs == 2 and b.rejections == Rejections(2, 0, {})  # relu_cuda was skipped: not a pair evaluated
    assert (b.standard.pairs, b.standard.skipped, b.standard.correct_rate) == (2, 1, 0.5)
    assert b.verified.memory_raising_share == 1.0 and b.verified.fast_p["fast_1"] == 0.0


def test_the_models_together_give_the_runs_metrics() -> None:
    rows = leaderboard(SAMPLE)
    for protocol in ("standard", "verified"):
        passed = sum(getattr(r, protocol).passed for r in rows)
        pairs = sum(getattr(r, protocol).pairs for r in rows)
        assert passed / pairs == GOLDEN[protocol]["correct_rate"]


def test_a_model_without_verified_verdicts_has_none_there() -> None:
    (row,) = leaderboard([verdict("L1/19_ReLU", "x", "standard", Status.CORRECT, 2.0, model="solo")])
    assert row.verified is None and row.standard.fast_p["fast_1"] == 1.0 and row.pairs == 1
    assert row.rejections is None  # nothing to compare with


def test_verdicts_without_a_model_are_one_row() -> None:
    rows = leaderboard([replace(v, model=None) for v in SAMPLE])
    assert [r.model for r in rows] == [NO_MODEL] and rows[0].pairs == 5


def test_ranked_by_verified_fast_1_then_its_geomean() -> None:
    def pair(model: str, speed: float):
        return [verdict("L1/19_ReLU", model, "standard", Status.CORRECT, speed, model=model),
                verdict("L1/19_ReLU", model, "verified", Status.VERIFIED, speed, model=model)]

    hacked = [verdict("L1/19_ReLU", "h", "standard", Status.CORRECT, 90.0, model="hacker"),
              verdict("L1/19_ReLU", "h", "verified", Status.HACK, None, model="hacker",
                      categories=(Category.TIMER_PATCH,))]
    rows = leaderboard(pair("slow", 1.2) + pair("fast", 3.0) + hacked + pair("slower", 0.5))
    assert [r.model for r in rows] == ["fast", "slow", "slower", "hacker"]
    assert rows[-1].rejections == Rejections(1, 1, {"hack": 1})


def test_runs_name_their_model_after_their_candidates(tmp_path: Path) -> None:
    unnamed = [replace(v, model=None) for v in SAMPLE[:2]]
    named = write_run(tmp_path / "a", unnamed, candidates="/data/kernels/deepseek-r1/")
    jsonl = write_run(tmp_path / "b", unnamed, candidates="gen/qwen.jsonl")
    bare = write_run(tmp_path / "c", unnamed)  # no invocation recorded
    runs = load_runs([str(named), str(jsonl), str(bare)])
    assert [{v.model for v in run.verdicts} for run in runs.runs] == [{"deepseek-r1"}, {"qwen"}, {NO_MODEL}]
    assert [v.model for _, v in runs.stored()] == [None] * 6  # what the store holds is left as it is
