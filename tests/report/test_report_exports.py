"""Parquet and CSV exports: one row per verdict, the documented columns, values that read back."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from kbv.errors import UsageError
from kbv.report.exports import read_rows, write_csv
from kbv.report.publish import write_report
from kbv.report.schema import COLUMN_NAMES, COLUMNS, verdict_row
from kbv.verdict import Verdict
from records import REPORTED, SAMPLE

README = Path(__file__).resolve().parents[2] / "README.md"


def documented_schema() -> list[tuple[str, str, str]]:
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- export-schema", 1)[1].split("<!-- /export-schema -->", 1)[0]
    return [(m.group(1), m.group(2), m.group(3)) for m in re.finditer(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", block, re.M)]


def test_the_readme_documents_exactly_the_schema() -> None:
    assert documented_schema() == [(c.name, c.type, c.description) for c in COLUMNS]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_round_trip_one_row_per_verdict_in_the_schemas_columns(sample_run: Path, fmt: str) -> None:
    written = write_report([str(sample_run)], fmt)
    assert written.path == sample_run / f"verdicts.{fmt}" and written.verdicts == len(SAMPLE)
    rows = read_rows(written.path)
    assert len(rows) == len(SAMPLE)
    assert all(tuple(r) == COLUMN_NAMES for r in rows)
    assert rows == [verdict_row(v, str(sample_run)) for v in REPORTED]


def test_the_parquet_types_are_the_documented_ones(sample_run: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    schema = pq.read_schema(str(write_report([str(sample_run)], "parquet").path))
    arrow = {"int": "int64", "float": "double", "bool": "bool", "string": "string"}
    assert [(f.name, str(f.type)) for f in schema] == [(c.name, arrow[c.type]) for c in COLUMNS]


def test_csv_is_plain_csv_with_a_header(sample_run: Path) -> None:
    with write_report([str(sample_run)], "csv").path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        body = list(reader)
    assert header == list(COLUMN_NAMES) and len(body) == len(SAMPLE)
    slow = next(r for r in map(dict, (zip(header, row) for row in body))
                if (r["candidate"], r["protocol"]) == ("gemm_slow", "verified"))
    assert (slow["candidate"], slow["protocol"], slow["passed"], slow["speedup"]) == \
        ("gemm_slow", "verified", "true", "0.0029")
    assert slow["peak_ratio"] == "3.0" and slow["device_peak_ratio"] == "" and slow["categories"] == ""


def test_figures_are_flat_and_the_evidence_is_one_json_column() -> None:
    rows = {(v.candidate, v.protocol): verdict_row(v, "run") for v in SAMPLE}
    cache = rows[("relu_cache", "verified")]
    assert (cache["status"], cache["categories"], cache["hack_categories"], cache["findings"]) == \
        ("hack", "result_cache", "result_cache", 1)
    cpp = rows[("relu_cpp", "verified")]
    assert cpp["speedup_ci_low"] == pytest.approx(1.425) and cpp["baseline"] == "eager-tf32"
    assert cpp["custom_share"] == 0.97 and cpp["trials"] == 8 and cpp["trials_passed"] == 8
    assert cpp["candidate_ms"] == pytest.approx(1 / 1.5) and cpp["baseline_ms"] == 1.0
    evidence = json.loads(cpp["evidence_json"])
    assert set(evidence) == {"evidence", "trials", "findings", "flags", "timing", "memory", "baseline_memory",
                             "provenance"}
    assert evidence["evidence"]["attribution"]["kernels"][0]["name"] == "relu_kernel"
    rebuilt = Verdict.from_dict({**SAMPLE[1].to_dict(), **evidence})
    assert rebuilt == SAMPLE[1]  # nothing of the verdict is lost between the flat columns and the JSON


def test_a_device_peak_ratio_is_read_where_a_run_has_one() -> None:
    from dataclasses import replace

    v = replace(SAMPLE[1], evidence={**SAMPLE[1].evidence, "memory": {"device_peak_ratio": 1.25}})
    assert verdict_row(v, "run")["device_peak_ratio"] == 1.25
    assert verdict_row(SAMPLE[1], "run")["device_peak_ratio"] is None


def test_several_runs_in_one_export(sample_run: Path, tmp_path: Path) -> None:
    from records import write_run

    other = write_run(tmp_path / "other", SAMPLE[:3])
    rows = read_rows(write_report([str(sample_run), str(other)], "csv", str(tmp_path / "all.csv")).path)
    assert [r["run"] for r in rows] == [str(sample_run)] * len(SAMPLE) + [str(other)] * 3


def test_an_empty_run_exports_the_header_only(tmp_path: Path) -> None:
    from records import write_run

    path = write_report([str(write_run(tmp_path / "empty", []))], "csv").path
    assert path.read_text().splitlines() == [",".join(COLUMN_NAMES)]
    assert read_rows(path) == []


def test_an_unwritable_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Cannot write"):
        write_csv([], tmp_path / "no" / "such" / "dir.csv")


def test_peak_ratio_of_two_zero_peaks_is_one() -> None:
    from dataclasses import replace

    from kbv.report.figures import peak_ratio
    from kbv.verdict import MemoryStats

    zero, some = MemoryStats(0, 0), MemoryStats(4096, 0)
    assert peak_ratio(replace(SAMPLE[1], memory=zero, baseline_memory=zero)) == 1.0
    assert peak_ratio(replace(SAMPLE[1], memory=some, baseline_memory=zero)) is None
    assert peak_ratio(replace(SAMPLE[1], memory=some, baseline_memory=MemoryStats(1024, 0))) == 4.0
    assert peak_ratio(replace(SAMPLE[1], memory=None)) is None


def test_a_verified_timing_without_a_speedup_still_gives_both_sides_times() -> None:
    """Calls too short to time against the window's costs: verified, no speedup, the figures kept."""
    from dataclasses import replace

    from kbv.report.figures import primary_baseline, speedup_interval, timed_ms

    v = SAMPLE[1]
    assert v.timing is not None
    short = replace(v, speedup=None, timing=replace(v.timing, speedups={}, speedup_ci={}))
    assert primary_baseline(short) == "eager-tf32" and speedup_interval(short) is None
    assert timed_ms(short) == timed_ms(v)
