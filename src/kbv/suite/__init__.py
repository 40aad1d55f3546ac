"""The bundled suite: problems of our own writing in KernelBench's format, in two sizes.

Each file under `problems/levelN/` is a KernelBench problem at full GPU size (the reference takes
1-10 ms on an H200). Size constants carry a marker that gives the smoke size:

    batch_size = 4096  # kbv: smoke=16

`smoke` rewrites every marked assignment to its smoke value (a forward runs well under a second on a
CPU); `full` is the file as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

SUITES = ("smoke", "full")
_MARK_RE = re.compile(r"^(?P<lhs>\s*[A-Za-z_][A-Za-z_0-9]*\s*=\s*)(?P<value>.+?)\s*#\s*kbv:\s*smoke=(?P<smoke>.+?)\s*$")


@dataclass(frozen=True)
class SuiteSource:
    """One bundled problem's source at a suite's size (`kbv.problems.load_problems` makes it a Problem)."""

    stem: str
    code: str
    origin: str
    level: int


def suite_sources(name: str) -> list[SuiteSource]:
    """Every problem source of the bundled suite `name` ('smoke' or 'full'), by level and file name."""
    if name not in SUITES:
        from kbv.errors import UsageError, did_you_mean
        raise UsageError(f"Unknown suite '{name}'.{did_you_mean(name, SUITES)}")
    root = resources.files(__package__) / "problems"
    out = []
    for level_dir in sorted(root.iterdir(), key=lambda p: p.name):
        if not level_dir.name.startswith("level"):
            continue
        level = int(level_dir.name.removeprefix("level"))
        for f in sorted(level_dir.iterdir(), key=lambda p: p.name):
            if not f.name.endswith(".py") or f.name.startswith("_"):
                continue
            code = f.read_text(encoding="utf-8")
            out.append(SuiteSource(f.name.removesuffix(".py"), smoke_source(code) if name == "smoke" else code,
                                   f"suite:{name}/{level_dir.name}/{f.name}", level))
    return out


def smoke_source(code: str) -> str:
    """`code` with every `# kbv: smoke=V` assignment set to V (the marker is dropped)."""
    out = []
    for line in code.splitlines():
        m = _MARK_RE.match(line)
        out.append(f"{m.group('lhs')}{m.group('smoke')}" if m else line)
    return "\n".join(out) + "\n"
