"""Code extraction: the one fenced block of a reply that is the candidate.

The rule, in order:

1. Line endings are normalised (CRLF and lone CR become LF).
2. Fenced blocks are found line by line: an opening line is three or more backticks or tildes, optionally
   indented and followed by an info string whose first word is the language tag; the block ends at a line
   of the same character, at least as long, and nothing else. A fence left open runs to the end of the
   reply (a reply cut off by the token limit keeps its last block). The opening fence's indentation is
   removed from the block's lines.
3. A block *defines ModelNew* when a line of it starts (after white space) with `class ModelNew`.
4. Among the blocks tagged python (`python`, `py`, `python3`, `py3`, any case) or untagged that define
   ModelNew, the LAST one is the candidate: models that write several usually refine as they go.
5. Only if no such block exists, the last block with any other tag that defines ModelNew is taken (a
   mislabelled fence such as ```cuda around Python code).
6. Otherwise the reply has no code: it becomes a `no_code` candidate, counted as a failure, never dropped.
   Code outside fences is not taken, even when the whole reply is Python.

Everything here is a pure function of the reply text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})
_OPEN_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MODEL_NEW_RE = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


@dataclass(frozen=True)
class FencedBlock:
    """One fenced block of a reply."""

    tag: str  # the info string's first word, lower-cased; "" when untagged
    code: str  # the lines between the fences, ending in a newline (or "" when empty)
    terminated: bool  # False when the reply ended inside the block

    @property
    def is_python(self) -> bool:
        return self.tag in PYTHON_TAGS

    @property
    def defines_model_new(self) -> bool:
        return defines_model_new(self.code)


def normalise_newlines(text: str) -> str:
    """`text` with CRLF and lone CR turned into LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def defines_model_new(code: str) -> bool:
    """Whether some line of `code` starts a `class ModelNew` definition."""
    return _MODEL_NEW_RE.search(code) is not None


def fenced_blocks(text: str) -> tuple[FencedBlock, ...]:
    """Every fenced block of `text`, in order (see the module docstring for the fence rules)."""
    lines = normalise_newlines(text).split("\n")
    blocks: list[FencedBlock] = []
    i = 0
    while i < len(lines):
        opening = _parse_opening(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, tag = opening
        end = _find_closing(lines, i + 1, fence)
        body = [_dedent(line, len(indent)) for line in lines[i + 1:end]]
        blocks.append(FencedBlock(tag=tag, code=_join(body), terminated=end < len(lines)))
        i = end + 1
    return tuple(blocks)


def select_block(blocks: tuple[FencedBlock, ...]) -> FencedBlock | None:
    """The candidate block: the last python/untagged block defining ModelNew, else the last other one."""
    defining = [b for b in blocks if b.defines_model_new]
    python = [b for b in defining if b.is_python]
    if python:
        return python[-1]
    return defining[-1] if defining else None


def extract_model_new(text: str) -> str | None:
    """The candidate's source from a reply, or None when the reply has no block defining ModelNew."""
    block = select_block(fenced_blocks(text))
    return block.code if block is not None else None


def _parse_opening(line: str) -> tuple[str, str, str] | None:
    """(indent, fence, tag) when `line` opens a fence."""
    match = _OPEN_RE.match(line)
    if match is None:
        return None
    fence, info = match.group("fence"), match.group("info").strip()
    if fence[0] == "`" and "`" in info:  # "```py```" or inline code, not a fence
        return None
    tag = info.split()[0].lower().lstrip("{.").rstrip("}") if info else ""
    return match.group("indent"), fence, tag


def _find_closing(lines: list[str], start: int, fence: str) -> int:
    """Index of the closing fence line at or after `start`, or len(lines) when the fence stays open."""
    for j in range(start, len(lines)):
        stripped = lines[j].strip()
        if len(stripped) >= len(fence) and set(stripped) == {fence[0]}:
            return j
    return len(lines)


def _dedent(line: str, width: int) -> str:
    """`line` with up to `width` leading spaces or tabs removed (the opening fence's indentation)."""
    k = 0
    while k < width and k < len(line) and line[k] in " \t":
        k += 1
    return line[k:]


def _join(lines: list[str]) -> str:
    """The block's text without leading or trailing blank lines, ending in a newline."""
    first = next((k for k, line in enumerate(lines) if line.strip()), len(lines))
    last = max((k for k, line in enumerate(lines) if line.strip()), default=-1)
    return "\n".join(lines[first:last + 1]) + "\n" if first <= last else ""
