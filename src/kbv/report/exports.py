"""Parquet and CSV exports: one row per verdict, in the columns of `kbv.report.schema`.

Parquet needs pyarrow (the `parquet` extra), imported here only. CSV needs nothing: a missing value (and
empty text, which rows never hold) is an empty field, booleans are `true`/`false`; `read_rows` turns either file back into typed rows.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from kbv.errors import UsageError
from kbv.report.schema import COLUMN_NAMES, COLUMNS

_CONVERT = {"int": int, "float": float, "bool": lambda s: s == "true", "string": str}


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write `rows` (from `verdict_row`) as CSV with a header; returns the path."""
    with _opened(path) as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMN_NAMES), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(row[k]) for k in COLUMN_NAMES})
    return path


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write `rows` as one Parquet file with the schema's types; returns the path."""
    pa, pq = _pyarrow()
    schema = pa.schema([pa.field(c.name, _arrow_type(pa, c.type), nullable=True) for c in COLUMNS])
    table = pa.Table.from_pylist([{k: row[k] for k in COLUMN_NAMES} for row in rows], schema=schema)
    try:
        pq.write_table(table, str(path))
    except OSError as exc:
        raise UsageError(f"Cannot write {path}: {exc}") from exc
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an export written by `write_csv` or `write_parquet` (by the suffix), typed."""
    path = Path(path)
    if path.suffix == ".parquet":
        _, pq = _pyarrow()
        return pq.read_table(str(path)).to_pylist()
    with path.open(newline="", encoding="utf-8") as f:
        return [{c.name: _csv_value(row[c.name], c.type) for c in COLUMNS} for row in csv.DictReader(f)]


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _csv_value(text: str, kind: str) -> Any:
    if text == "":
        return None
    value = _CONVERT[kind](text)
    return None if isinstance(value, float) and math.isnan(value) else value


def _arrow_type(pa: Any, kind: str) -> Any:
    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "string": pa.string()}[kind]


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise UsageError("Parquet export needs pyarrow: pip install 'kernelbench-verified[parquet]'") from exc
    return pa, pq


@contextmanager
def _opened(path: Path) -> Iterator[TextIO]:
    """`path` opened for writing as UTF-8 text; a path that cannot be written is a UsageError."""
    try:
        f = Path(path).open("w", newline="", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write {path}: {exc.strerror or exc}") from exc
    with f:
        yield f
