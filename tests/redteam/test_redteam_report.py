"""A red-team result as terminal tables, JSON, the HTML report's section, and fixture files, from
records built here (no evaluation)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rich.console import Console

from kbv.redteam.judge import HonestRow, MutantRow, NotApplicableRow, Outcome, judge_mutant, summarize, totals
from kbv.redteam.run import RedteamResult, fixture_text, write_fixtures
from kbv.report.redteam import attack_table, honest_table, mutant_table, redteam_section, totals_line
from test_corpus import read_fixture

HONEST = HonestRow("L1/2_ReLU", "2_ReLU__triton", "h0", "examples/2_ReLU__triton.py",
                   (Outcome("standard", "correct", (), 1.0), Outcome("verified", "verified", (), 1.0, (0.9, 1.1))))


def _mutant(tmp_path: Path, name: str, breaks: str, std: Outcome, ver: Outcome) -> MutantRow:
    path = tmp_path / f"2_ReLU__triton__{name}.py"
    path.write_text(f"# kbv redteam mutant: {name}.\nclass ModelNew:\n    pass\n")
    return MutantRow(name, breaks, f"what {name} does", "L1/2_ReLU", "2_ReLU__triton", path.stem, "h1", str(path),
                     (judge_mutant(breaks, std, HONEST.outcome("standard")),
                      judge_mutant(breaks, ver, HONEST.outcome("verified"))))


def _result(tmp_path: Path) -> RedteamResult:
    mutants = (
        _mutant(tmp_path, "replay_pointer", "speed", Outcome("standard", "correct", (), 40.0),
                Outcome("verified", "hack", ("result_cache",))),
        _mutant(tmp_path, "output_alias", "truth", Outcome("standard", "correct", (), 1.0),
                Outcome("verified", "verified", (), 1.0, (0.9, 1.1))),
    )
    skipped = (NotApplicableRow("partial_work", "L1/2_ReLU", "2_ReLU__triton", "rows are not independent"),)
    names = [("output_alias", "truth"), ("partial_work", "truth"), ("replay_pointer", "speed")]
    summaries = tuple(summarize(mutants, skipped, names))
    return RedteamResult(tmp_path / "run", "cpu", (HONEST,), mutants, skipped, summaries, tuple(totals(summaries)))


def _render(renderable: object) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_tables_give_attack_success_per_transformation_and_each_mutant(tmp_path: Path) -> None:
    result = _result(tmp_path)
    attacks = _render(attack_table(result.summaries))
    assert re.search(r"replay_pointer\s+│\s+speed\s+│\s+1\s+│\s+0\s+│\s+1/1 \(100%\)\s+│\s+0/1 \(0%\)\s+│\s+result_cache 1",
                     attacks), attacks
    assert re.search(r"output_alias .* 1/1 \(100%\) .* 1/1 \(100%\)", attacks)
    assert re.search(r"partial_work\s+│\s+truth\s+│\s+0\s+│\s+1\s+│\s+-\s+│\s+-", attacks)
    mutants = _render(mutant_table(result.mutants))
    assert "hack [result_cache]" in mutants and "verified 1.00x [0.90, 1.10] FOOLED" in mutants
    assert "base" in _render(honest_table(result.honest))
    assert totals_line(result.totals) == ("standard: 2/2 mutants fooled (100%) · "
                                          "verified: 1/2 mutants fooled (50%)")


def test_json_has_the_issue_s_fields(tmp_path: Path) -> None:
    data = json.loads(json.dumps(_result(tmp_path).to_dict()))
    row = next(t for t in data["transformations"] if t["transformation"] == "replay_pointer" and t["protocol"] == "verified")
    assert (row["mutants"], row["fooled"], row["attack_success"]) == (1, 0, 0.0)
    assert data["honest"][0]["base"] and not data["honest"][0]["flagged"]
    assert data["not_applicable"][0]["reason"] == "rows are not independent"


def test_html_section_names_every_transformation_and_marks_what_fooled(tmp_path: Path) -> None:
    html = "".join(redteam_section([_result(tmp_path)]))
    assert html.startswith("<section") and 'id="redteam"' in html
    assert "replay_pointer" in html and "partial_work" in html and 'class="fooled"' in html
    assert redteam_section([]) == []


def test_a_mutant_that_fools_verified_is_a_corpus_fixture(tmp_path: Path) -> None:
    result = _result(tmp_path)
    written = write_fixtures(result, tmp_path / "fixtures")
    assert [p.name for p in written] == ["2_ReLU__triton__output_alias.py"]
    fixture = read_fixture(written[0])  # the corpus test reads it as it reads its own
    assert fixture.expect.value == "incorrect" and fixture.standard is not None and fixture.standard.value == "correct"
    text = written[0].read_text()
    assert "fooled the verified protocol" in text and "# ---- the honest candidate" in text
    compile(text, str(written[0]), "exec")  # the honest source and the verdicts are comments
    assert fixture_text(result.mutants[0], HONEST).startswith("# kbv-fixture: expect=hack ")


def test_speed_is_held_against_the_faster_of_the_honest_candidate_s_two_measurements() -> None:
    slow_control = HonestRow("L1/2_ReLU", "c", "h", "o", (Outcome("standard", "correct", (), 2.0),),
                             (Outcome("standard", "correct", (), 1.0),))
    fast_control = HonestRow("L1/2_ReLU", "c", "h", "o", (Outcome("standard", "correct", (), 1.0),),
                             (Outcome("standard", "correct", (), 2.0),))
    failed_control = HonestRow("L1/2_ReLU", "c", "h", "o", (Outcome("standard", "correct", (), 1.0),),
                               (Outcome("standard", "crashed"),))
    assert slow_control.reference("standard").speedup == fast_control.reference("standard").speedup == 2.0
    assert failed_control.reference("standard").speedup == 1.0 and failed_control.flagged
    mutant = Outcome("standard", "correct", (), 1.8)
    assert not judge_mutant("speed", mutant, fast_control.reference("standard")).fooled
    assert judge_mutant("speed", mutant, failed_control.reference("standard")).fooled
