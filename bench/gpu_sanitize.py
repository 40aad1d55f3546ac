"""Rewrite the device machine's own paths in what a GPU call brought back, before it is committed:
logs, JSON and run databases (kbv.sqlite, whose verdicts keep tracebacks and stderr).

    python bench/gpu_sanitize.py FILE...

The box's torch lives in /opt/torch/.venv, its $OUT is /root/out, and pytest's temporary folders are
/tmp/pytest-of-USER/pytest-N; the checkout's root is whatever stands before src/kbv/ in the text, or
pytest's rootdir. What is published names them <venv>, $OUT, <tmp> and <repo>. A database is rewritten
in place, then checkpointed into one file (no -wal or -shm beside it), so that a later call can resume
from it.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

REWRITES = [  # each path whole: /root/out, never the start of /root/outer
    (re.compile(r"/opt/torch/\.venv(?![\w.-])"), "<venv>"),
    (re.compile(r"/root/out(?![\w.-])"), "$OUT"),
    (re.compile(r"/tmp/pytest-of-[\w-]+/pytest-\d+(?![\w.-])"), "<tmp>"),
]
# the checkout's root, wherever the box put it: what stands before kbv's own source in a traceback,
# or pytest's rootdir
REPO = re.compile(r"(?<![\w.-])(/[\w/.-]+?)/src/kbv/|^rootdir: (/[\w/.-]+)", re.MULTILINE)


def clean(text: str) -> str:
    for root in sorted({m.group(1) or m.group(2) for m in REPO.finditer(text)}, key=len, reverse=True):
        text = re.sub(re.escape(root) + r"(?![\w.-])", "<repo>", text)
    for pattern, repl in REWRITES:
        text = pattern.sub(repl, text)
    return text


def clean_database(path: Path) -> int:
    """Every text column of every table, rewritten; returns the cells changed."""
    db = sqlite3.connect(path)
    changed = 0
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        columns = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
        for row in db.execute(f'SELECT rowid, * FROM "{table}"').fetchall():
            cleaned = {c: (v, clean(v)) for c, v in zip(columns, row[1:]) if isinstance(v, str)}
            updates = {c: new for c, (old, new) in cleaned.items() if new != old}
            if updates:
                sets = ", ".join(f'"{c}" = ?' for c in updates)
                db.execute(f'UPDATE "{table}" SET {sets} WHERE rowid = ?', [*updates.values(), row[0]])
                changed += len(updates)
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    return changed


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python bench/gpu_sanitize.py FILE... (logs, JSON, kbv.sqlite)", file=sys.stderr)
        return 2
    for name in paths:
        path = Path(name)
        if not path.is_file():
            print(f"{name}: no such file", file=sys.stderr)
            return 2
        if path.suffix == ".sqlite":
            print(f"{name}: {clean_database(path)} cells rewritten")
            continue
        text = path.read_text(encoding="utf-8", errors="surrogateescape")  # other bytes written back as they were
        new = clean(text)
        if new != text:
            path.write_text(new, encoding="utf-8", errors="surrogateescape")
        print(f"{name}: {'rewritten' if new != text else 'clean'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
