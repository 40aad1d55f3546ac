"""Finding candidates' source text again, for the report's highlighted findings.

A verdict keeps the candidate's hash, not its text; the run records the candidates argument of every
`kbv eval`. The text is looked up there (a .py file, a directory of them, a .jsonl of candidates) and
matched by content hash, so a file edited since the run is never shown against findings it did not
produce. A source that cannot be found is simply absent: the report says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from kbv.problems import content_hash

MAX_FILES = 20_000  # a directory walk stops here
MAX_BYTES = 2 << 20  # larger files are not candidates


def find_sources(specs: Iterable[str], wanted: set[str], anchors: Iterable[Path] = ()) -> dict[str, str]:
    """{candidate hash: source} for the hashes in `wanted` found under `specs` (paths as the user
    gave them: as they are, else relative to each of `anchors`)."""
    found: dict[str, str] = {}
    anchors = list(anchors)
    for spec in dict.fromkeys(specs):
        path = _resolve(spec, anchors)
        if path is None:
            continue
        for code in _texts(path):
            digest = content_hash(code)
            if digest in wanted:
                found.setdefault(digest, code)
        if wanted <= set(found):
            break
    return found


def _resolve(spec: str, anchors: list[Path]) -> Path | None:
    path = Path(spec)
    candidates = [path] if path.is_absolute() else [path] + [a / path for a in anchors]
    return next((p for p in candidates if p.exists()), None)


def _texts(path: Path) -> Iterator[str]:
    if path.is_dir():
        for i, file in enumerate(sorted(path.rglob("*.py"))):
            if i >= MAX_FILES:
                return
            yield from _read(file)
    elif path.suffix == ".jsonl":
        for line in _read(path):
            yield from _jsonl_codes(line)
    else:
        yield from _read(path)


def _read(path: Path) -> Iterator[str]:
    limit = MAX_BYTES * 64 if path.suffix == ".jsonl" else MAX_BYTES  # a JSONL holds many candidates
    try:
        if path.stat().st_size <= limit:
            yield path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return


def _jsonl_codes(text: str) -> Iterator[str]:
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("code"), str):
            yield record["code"]
