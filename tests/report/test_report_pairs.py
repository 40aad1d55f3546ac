"""What every report says about pairs, on a run like `make demo`'s on a CPU (ten candidates under both
protocols, two of them skipped, four hacks rejected by verified under four statuses): one count of
pairs everywhere, what the verified protocol took back, and one order of verdicts in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kbv.cli import app
from kbv.report.exports import read_rows
from kbv.report.publish import write_report
from kbv.verdict import Status
from pagetree import parse
from records import DEMO, DEMO_EVALUATED, verdict, write_run

REJECTS = "Standard passes, verified rejects: 4 of 8 pairs (hack 1, incorrect 1, integrity_violation 1, no_custom_kernel 1)"


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout


def rows_of(table) -> dict[str, list[str]]:
    """{first cell: the other cells} of each body row of a table."""
    return {cells[0]: cells[1:] for cells in ([td.text() for td in tr.find_all("td")]
                                              for body in table.find_all("tbody") for tr in body.find_all("tr"))}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("demo") / "run", DEMO)


@pytest.fixture(scope="module")
def demo_page(demo_run: Path):
    return parse(write_report([str(demo_run)], "html").path.read_text(encoding="utf-8"))


def test_the_leaderboard_the_summary_and_the_metrics_count_the_same_pairs(demo_run: Path, demo_page) -> None:
    """Skipped pairs are not evaluated: 8 pairs of 10 everywhere, not 10 in one place and 8 in another."""
    summary = rows_of(demo_page.by_id("summary-table"))
    assert summary["pairs"] == [str(DEMO_EVALUATED)] * 2 and summary["skipped"] == ["2", "2"]
    board = demo_page.by_id("leaderboard-table")
    headers = [th.text() for th in board.find_all("th")]
    assert dict(zip(headers, ["examples", *rows_of(board)["examples"]]))["pairs"] == str(DEMO_EVALUATED)
    table = json.loads(invoke("report", str(demo_run), "--format", "json"))["metrics"]
    assert [table[p]["all"]["pairs"] for p in ("standard", "verified")] == [DEMO_EVALUATED] * 2
    terminal = invoke("report", str(demo_run))  # the metrics table: protocol, group, pairs, ...
    assert [line.split("│")[3].strip() for line in terminal.splitlines()
            if line.startswith("│") and line.split("│")[2].strip() == "all"] == [str(DEMO_EVALUATED)] * 2
    by_model = invoke("report", str(demo_run), "--by", "model")
    first = next(line for line in by_model.splitlines() if "examples" in line)  # the table may continue below
    assert first.split("│")[2].strip() == str(DEMO_EVALUATED)


def test_what_verified_rejects_is_said_with_its_statuses(demo_run: Path, demo_page) -> None:
    assert demo_page.by_id("rejections").text() == REJECTS
    board = demo_page.by_id("leaderboard-table")
    headers = [th.text() for th in board.find_all("th")]
    row = dict(zip(headers, ["examples", *rows_of(board)["examples"]]))
    assert row["standard passes, verified rejects"] == REJECTS.split(": ", 1)[1]
    assert "hacks caught" not in headers
    hacks = rows_of(demo_page.by_id("hacks"))  # the per-category table stays
    assert hacks == {"result_cache": ["0", "1"]}
    terminal = " ".join(invoke("report", str(demo_run)).split())
    assert REJECTS in terminal and "Hacks by category" in terminal


def test_a_run_under_one_protocol_says_nothing_of_rejections(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [v for v in DEMO if v.protocol == "standard"])
    page = parse(write_report([str(run)], "html").path.read_text(encoding="utf-8"))
    assert not any(n.attrs.get("id") == "rejections" for n in page.iter())
    assert "Standard passes, verified rejects" not in invoke("report", str(run))


# -- one order in every format ------------------------------------------------------------------

LATE = verdict("L2/3_Gemm", "3_Gemm__x", "standard", Status.CORRECT, 1.0, model="examples")
ORDER = [  # level, then problem id (11 after 7), then name; candidate; standard before verified
    *[(p, c, proto) for p, c in [("L1/1_Matmul", "1_Matmul__cuda"), ("L1/1_Matmul", "1_Matmul__hack_pointer_cache"),
                                 ("L1/2_ReLU", "2_ReLU__cpp"), ("L1/2_ReLU", "2_ReLU__cuda"),
                                 ("L1/2_ReLU", "2_ReLU__hack_identity"), ("L1/2_ReLU", "2_ReLU__triton"),
                                 ("L1/4_GELU", "4_GELU__hack_fallback"), ("L1/6_Softmax", "6_Softmax__triton"),
                                 ("L1/7_SumReduction", "7_SumReduction__cpp"),
                                 ("L1/11_MSELoss", "11_MSELoss__hack_constant")]
      for proto in ("standard", "verified")],
    ("L2/3_Gemm", "3_Gemm__x", "standard"),
]


@pytest.fixture(scope="module")
def shuffled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's verdicts stored as a run with several lanes might finish them: verified first,
    problems out of order, a level-2 problem before everything."""
    stored = [LATE, *DEMO[1::2][::-1], *DEMO[0::2][::3], *DEMO[0::2][1::3], *DEMO[0::2][2::3]]
    assert sorted(map(id, stored)) == sorted(map(id, (*DEMO, LATE)))
    return write_run(tmp_path_factory.mktemp("shuffled") / "run", stored)


def test_every_format_lists_verdicts_in_the_problems_order(shuffled_run: Path) -> None:
    run = str(shuffled_run)
    report = json.loads(invoke("report", run, "--format", "json"))
    assert [(v["problem"], v["candidate"], v["protocol"]) for v in report["verdicts"]] == ORDER
    lines = [json.loads(line) for line in invoke("report", run, "--format", "jsonl").splitlines()]
    assert [(v["problem"], v["candidate"], v["protocol"]) for v in lines] == ORDER
    for fmt in ("csv", "parquet"):
        rows = read_rows(write_report([run], fmt).path)
        assert [(r["problem"], r["candidate"], r["protocol"]) for r in rows] == ORDER, fmt
    page = parse(write_report([run], "html").path.read_text(encoding="utf-8"))
    shown = [[td.text() for td in body.find("tr").find_all("td")]
             for body in page.by_id("pairs-table").find_all("tbody", **{"class": "verdict"})]
    assert [(cells[0], cells[2], cells[4]) for cells in shown] == ORDER


def test_the_terminal_table_lists_pairs_in_the_problems_order(shuffled_run: Path) -> None:
    text = invoke("report", str(shuffled_run))
    header = next(line for line in text.splitlines() if "problem" in line and "candidate" in line)
    assert header.index("standard") < header.index("verified")
    pairs = list(dict.fromkeys((p, c) for p, c, _ in ORDER))
    listed = [(cells[1].strip(), cells[2].strip()) for cells in (line.split("│") for line in text.splitlines())
              if len(cells) > 3 and (cells[1].strip(), cells[2].strip()) in pairs]
    assert listed == pairs
