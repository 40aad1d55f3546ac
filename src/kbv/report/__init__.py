"""Rendering results: terminal tables and machine-readable exports."""

from kbv.report.tables import metrics_table, pass_at_k_table, verdict_table

__all__ = ["metrics_table", "pass_at_k_table", "verdict_table"]
