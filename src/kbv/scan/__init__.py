"""Static scan of a candidate: its Python source and every CUDA/C++ string embedded in it.

`scan_source(code, fp32_problem)` returns findings, each naming a rule of `RULES` (id, severity,
category), the evidence and its line. A pure function: the code is parsed, never imported or run, and a
source that does not parse is one finding (KBV-S001), not an exception.

Findings are evidence attached to the verdict as warnings; the dynamic checks decide `hack`.

    rules.py   the rules (id, severity, category, message) and the Python names that fire them
    names.py   what a Python name or string expression stands for (imports, aliases, getattr chains)
    python.py  every rule over a Python syntax tree; hands the contents of strings to cpp.py
    cache.py   result caches keyed by pointers, ids, hashes or shapes; memoized or replayed forwards
    fastpath.py  input-dependent fast paths: forward branching on input values read on the host
    cpp.py     string contents: plain Python literals, and embedded C++/CUDA (tokenizer and rules)
"""

from __future__ import annotations

from collections.abc import Iterable

from kbv.scan.cpp import cpp_tokens, scan_cpp
from kbv.scan.python import _scan
from kbv.scan.rules import RULES, Rule
from kbv.verdict import Finding

__all__ = ["RULES", "Rule", "cpp_tokens", "scan_cpp", "scan_source"]


def scan_source(code: str, fp32_problem: bool = True) -> list[Finding]:
    """Findings of every rule on one candidate source, sorted by line then rule; one per (rule, line)."""
    return _dedupe(_scan(code, fp32_problem, depth=0))


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen: dict[tuple[str, int | None], Finding] = {}
    for f in findings:
        seen.setdefault((f.rule, f.line), f)
    return sorted(seen.values(), key=lambda f: (f.line or 0, f.rule))
