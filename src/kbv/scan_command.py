"""`kbv scan FILE...`: the static scan of candidate files, printed as a table or JSON.

Registered by the CLI with `app.command("scan")(scan_command)`. Findings are warnings, never a failure:
exit 0 whatever was found; 2, with one line on stderr, for a file that cannot be read or an unknown
--format.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kbv.errors import CandidateSourceError, KbvError, UsageError
from kbv.report.format import short_path
from kbv.scan import scan_source
from kbv.verdict import Finding

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def scan_command(
    files: list[str] = typer.Argument(..., help="Candidate .py files to scan."),
    fp32: bool = typer.Option(True, "--fp32/--no-fp32",
                              help="The problems are fp32: flag half/bf16/TF32 casts (--no-fp32 for fp16/bf16)."),
    output: str = typer.Option("table", "--format", help="table or json"),
) -> None:
    """Statically scan candidates for hack patterns (streams, threads, patching, caches, casts, ...)."""
    try:
        if output not in ("table", "json"):
            raise UsageError(f"Unknown format '{output}': expected table or json.")
        sources = [(path, read_source(path)) for path in files]
    except KbvError as exc:
        _fail(str(exc))
    rows = [(path, f) for path, code in sources for f in scan_source(code, fp32_problem=fp32)]
    if output == "json":
        payload = {"files": files, "findings": [finding_dict(p, f) for p, f in rows]}
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
    else:
        Console().print(findings_table(rows, files))


def read_source(path: str) -> str:
    """The text of a candidate file. Raises CandidateSourceError when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CandidateSourceError(f"Cannot read {path}: {exc.strerror or exc}.") from exc


def finding_dict(path: str, finding: Finding) -> dict[str, object]:
    """One finding as JSON-safe data, with the file it came from."""
    return {"file": path, **asdict(finding), "category": finding.category.value}


def findings_table(rows: list[tuple[str, Finding]], files: list[str]) -> Group:
    """Findings, in file then line order: a line of counts by severity, then one table per file with
    findings, titled with its path.

    Legible at 80 columns (a pipe): paths are shown relative to the working directory or shortened
    from the left, only the message wraps, and line, rule, severity and category stay whole."""
    counts = {s: sum(f.severity == s for _, f in rows) for s in ("error", "warning", "info")}
    scanned = short_path(files[0], 48) if len(files) == 1 else f"{len(files)} files"
    parts: list[Text | Table] = [
        Text(f"kbv scan: {scanned}, " + ", ".join(f"{n} {s}" for s, n in counts.items()), style="bold")]
    for path in dict.fromkeys(p for p, _ in rows):
        table = Table(title=Text(short_path(path, 72)), title_justify="left")
        for col in ("line", "rule", "severity", "category"):
            table.add_column(col, no_wrap=True)
        table.add_column("message", overflow="fold")
        for f in (f for p, f in rows if p == path):
            style = _SEVERITY_STYLE.get(f.severity, "")
            # Text cells: messages quote code such as `cache[key]`, which must not be read as markup
            table.add_row(str(f.line or "-"), f.rule, Text(f.severity, style=style), f.category.value, Text(f.message))
        parts.append(table)
    return Group(*parts)


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(2)
