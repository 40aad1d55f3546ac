"""How figures read: speedups with enough significant digits, percentages, byte counts, paths that fit.

Pure string functions, shared by the terminal tables, the HTML report and `kbv scan`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from kbv.verdict import Category

_ELLIPSIS = "…"


def format_speedup(x: float | None) -> str:
    """`1.52x`, `12.3x`, `0.50x`, `0.0031x`: two significant digits at least, never `0.00x`."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if not math.isfinite(x):
        return "inf x" if x > 0 else "-inf x"
    if x >= 100:
        return f"{x:.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    if x >= 1 or x <= 0:
        return f"{x:.2f}x"
    decimals = 1 - math.floor(math.log10(x))  # two significant digits below 1
    return f"{x:.{max(2, decimals)}f}x" if decimals <= 8 else f"{x:.1e}x"


def format_interval(ci: tuple[float, float] | None) -> str:
    """A speedup's confidence interval as `[1.48, 1.57]` (the `x` left off)."""
    if not ci:
        return ""
    return "[" + ", ".join(format_speedup(c).rstrip("x") for c in ci) + "]"


def format_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def format_ratio(x: float | None) -> str:
    """A memory ratio (candidate / baseline): `1.00x`, `0.25x`; `-` when unknown."""
    return "-" if x is None else format_speedup(x)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def short_path(path: str, width: int = 32, cwd: str | None = None) -> str:
    """`path` relative to the working directory when it lies below it, then shortened from the left
    (the file name is what tells files apart) to at most `width` characters."""
    cwd = cwd if cwd is not None else os.getcwd()
    shown = path
    try:
        absolute = Path(path).resolve()
        if absolute.is_relative_to(Path(cwd).resolve()):
            shown = os.path.relpath(absolute, Path(cwd).resolve())
    except (OSError, ValueError):
        pass
    if len(shown) <= width:
        return shown
    return _ELLIPSIS + shown[-(width - 1):]


def categories_and_message(categories: tuple[Category, ...], message: str) -> str:
    """`cat_a, cat_b: message`, naming each category once: one the message already names as
    `cat: ...` is not said again in front of it ("aliases_input: aliases_input: ..." was the bug)."""
    cats = list(dict.fromkeys(c.value for c in categories))
    unsaid = [c for c in cats if f"{c}:" not in message and message.strip() != c]
    prefix = ", ".join(unsaid)
    if not message:
        return prefix
    return f"{prefix}: {message}" if prefix else message
