"""How figures read: speedups never round to 0.00x, a category is said once, paths fit."""

from __future__ import annotations

import pytest

from kbv.report.format import categories_and_message, format_bytes, format_interval, format_speedup, short_path
from kbv.verdict import Category


@pytest.mark.parametrize("x, shown", [
    (0.0031, "0.0031x"), (0.00031, "0.00031x"), (0.004999, "0.0050x"), (0.05, "0.050x"), (0.5, "0.50x"),
    (0.999, "1.00x"), (1.0, "1.00x"), (1.52, "1.52x"), (12.34, "12.3x"), (123.4, "123x"), (3e-12, "3.0e-12x"),
    (None, ""), (float("inf"), "inf x"), (0.0, "0.00x")])
def test_speedups_keep_two_significant_digits(x, shown) -> None:
    assert format_speedup(x) == shown


def test_an_interval_reads_like_its_speedup() -> None:
    assert format_interval((0.00281, 0.00302)) == "[0.0028, 0.0030]"
    assert format_interval(None) == ""


def test_bytes() -> None:
    assert [format_bytes(n) for n in (None, 512, 3 << 20, 5 << 30)] == ["-", "512 B", "3.0 MiB", "5.0 GiB"]


@pytest.mark.parametrize("cats, message, shown", [
    ((Category.ALIASES_INPUT,), "aliases_input: the output aliases input 0", "aliases_input: the output aliases input 0"),
    ((Category.ALIASES_INPUT, Category.INPUT_MUTATED), "aliases_input: x",
     "input_mutated: aliases_input: x"),
    ((Category.VALUE_MISMATCH,), "max abs error 0.5", "value_mismatch: max abs error 0.5"),
    ((Category.VALUE_MISMATCH, Category.VALUE_MISMATCH), "", "value_mismatch"),
    ((), "a cuda candidate cannot run on cpu", "a cuda candidate cannot run on cpu"),
])
def test_a_category_is_said_once(cats, message, shown) -> None:
    assert categories_and_message(cats, message) == shown
    for c in cats:
        assert shown.count(c.value) == 1


def test_paths_relative_to_the_working_directory_or_shortened_from_the_left(tmp_path) -> None:
    inside = tmp_path / "cands" / "19_ReLU__x.py"
    assert short_path(str(inside), cwd=str(tmp_path)) == "cands/19_ReLU__x.py"
    far = "/a/very/long/absolute/path/outside/anything/19_ReLU__honest.py"
    shown = short_path(far, width=24, cwd=str(tmp_path))
    assert len(shown) == 24 and shown.startswith("…") and shown.endswith("19_ReLU__honest.py")
    assert short_path("/short.py", cwd=str(tmp_path)) == "/short.py"
