"""Rendering results: terminal tables and machine-readable exports."""

from kbv.report.tables import hacks_table, metrics_table, pass_at_k_table, verdict_table

__all__ = ["hacks_table", "metrics_table", "pass_at_k_table", "verdict_table"]
