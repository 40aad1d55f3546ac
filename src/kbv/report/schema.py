"""The export schema: one flat row per verdict (Parquet and CSV), written down once.

Figures are flat, typed columns; everything else a verdict holds (trials, findings, the evidence dict,
timing details, provenance) travels in one JSON column, `evidence_json`. Every column is nullable;
empty text is null (no categories, no message), so CSV and Parquet read back the same. `COLUMNS` is the schema the
README documents; `verdict_row` is the only place a row is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kbv.report.figures import (
    custom_share,
    device_peak_ratio,
    peak_ratio,
    primary_baseline,
    speedup_interval,
    timed_ms,
    timed_std_ms,
)
from kbv.verdict import Verdict, hack_categories

EXPORT_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # "string" | "int" | "float" | "bool"; every column is nullable
    description: str


COLUMNS: tuple[Column, ...] = (
    Column("run", "string", "the run directory the verdict was read from"),
    Column("problem", "string", "problem key, e.g. L1/19_ReLU"),
    Column("problem_hash", "string", "content hash of the problem source"),
    Column("level", "int", "KernelBench level (null when unknown)"),
    Column("candidate", "string", "candidate name"),
    Column("candidate_hash", "string", "content hash of the candidate source"),
    Column("model", "string", "the model that wrote the candidate (null when not recorded)"),
    Column("sample", "int", "sample index of that model (null when not recorded)"),
    Column("protocol", "string", "standard or verified"),
    Column("protocol_version", "string", "version of the protocol's rules"),
    Column("status", "string", "one status (correct, verified, incorrect, hack, ...)"),
    Column("passed", "bool", "status is correct or verified"),
    Column("categories", "string", "categories, comma-separated, each once"),
    Column("hack_categories", "string", "the categories that are evidence of a hack, comma-separated"),
    Column("message", "string", "why, in one line"),
    Column("speedup", "float", "primary baseline time / candidate time (null unless passed)"),
    Column("speedup_ci_low", "float", "lower end of the speedup's confidence interval (verified)"),
    Column("speedup_ci_high", "float", "upper end of the speedup's confidence interval (verified)"),
    Column("baseline", "string", "the primary baseline's name (eager, eager-tf32, ...)"),
    Column("candidate_ms", "float", "candidate time in ms, by the timing statistic"),
    Column("baseline_ms", "float", "primary baseline time in ms, by the timing statistic"),
    Column("candidate_std_ms", "float", "standard deviation of the candidate's timed calls, ms"),
    Column("baseline_std_ms", "float", "standard deviation of the primary baseline's timed calls, ms"),
    Column("timing_method", "string", "how it was timed"),
    Column("timing_statistic", "string", "mean_ms or median_ms"),
    Column("peak_bytes", "int", "candidate's peak memory of one forward, bytes above the level before"),
    Column("baseline_peak_bytes", "int", "the baseline's, measured the same way"),
    Column("retained_bytes", "int", "memory the candidate kept after its output was freed"),
    Column("peak_ratio", "float", "peak_bytes / baseline_peak_bytes (1 when both are 0; null when unknown)"),
    Column("device_peak_ratio", "float", "device-level peak ratio, where the run measured it"),
    Column("custom_share", "float", "share of device time in the candidate's own kernels (verified)"),
    Column("trials", "int", "correctness trials run"),
    Column("trials_passed", "int", "correctness trials passed"),
    Column("findings", "int", "static scan findings"),
    Column("wall_s", "float", "wall-clock seconds this verdict took"),
    Column("device_name", "string", "the device (GPU or CPU) it ran on"),
    Column("evidence_json", "string",
           "JSON object: evidence, trials, findings, flags, timing, memory, baseline_memory, provenance"),
)

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)


def verdict_row(v: Verdict, run: str) -> dict[str, Any]:
    """The flat row of one verdict; keys are exactly `COLUMN_NAMES`."""
    ci = speedup_interval(v)
    cand_ms, base_ms = timed_ms(v)
    cand_std, base_std = timed_std_ms(v)
    data = v.to_dict()
    row = {
        "run": run, "problem": v.problem, "problem_hash": v.problem_hash, "level": v.level,
        "candidate": v.candidate, "candidate_hash": v.candidate_hash, "model": v.model, "sample": v.sample,
        "protocol": v.protocol, "protocol_version": v.protocol_version, "status": v.status.value,
        "passed": v.status.passed, "categories": _joined(c.value for c in v.categories),
        "hack_categories": _joined(c.value for c in hack_categories(v.categories)), "message": v.message,
        "speedup": v.speedup, "speedup_ci_low": ci[0] if ci else None, "speedup_ci_high": ci[1] if ci else None,
        "baseline": primary_baseline(v), "candidate_ms": cand_ms, "baseline_ms": base_ms,
        "candidate_std_ms": cand_std, "baseline_std_ms": base_std,
        "timing_method": v.timing.method if v.timing else None,
        "timing_statistic": v.timing.statistic if v.timing else None,
        "peak_bytes": v.memory.peak_bytes if v.memory else None,
        "baseline_peak_bytes": v.baseline_memory.peak_bytes if v.baseline_memory else None,
        "retained_bytes": v.memory.retained_bytes if v.memory else None,
        "peak_ratio": peak_ratio(v), "device_peak_ratio": device_peak_ratio(v), "custom_share": custom_share(v),
        "trials": len(v.trials), "trials_passed": sum(t.passed for t in v.trials), "findings": len(v.findings),
        "wall_s": v.wall_s, "device_name": v.provenance.get("device_name"),
        "evidence_json": json.dumps({k: data[k] for k in (
            "evidence", "trials", "findings", "flags", "timing", "memory", "baseline_memory", "provenance")},
            sort_keys=True),
    }
    assert tuple(row) == COLUMN_NAMES  # the schema and the row are written together
    return {k: (None if value == "" else value) for k, value in row.items()}


def _joined(values: Any) -> str:
    return ",".join(dict.fromkeys(values))
