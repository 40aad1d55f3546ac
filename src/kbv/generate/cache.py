"""The response cache: one SQLite file, replies keyed by a hash of everything that decides them.

The key covers the model, the base URL, the messages, the sampling parameters (temperature, max tokens,
the extra body) and the sample index; not the API key, the timeout or the retry policy. Only replies
are stored: a failed request is asked again next time.

It lives beside kbv's build cache (`default_cache_dir()`: $KBV_CACHE_DIR, else ~/.cache/kbv). The
database runs in WAL mode with a busy timeout, so several `kbv generate` processes may share one cache;
within a process a lock serialises the connection, so any thread may use it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kbv.errors import HarnessError, UsageError
from kbv.generate.client import ChatRequest, Reply, Usage

CACHE_FILE = "responses.sqlite"
_KEY_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS replies_v1 (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    reply TEXT NOT NULL,        -- JSON: text, usage, finish_reason
    latency_s REAL NOT NULL,
    created_at REAL NOT NULL    -- unix seconds
)
"""


@dataclass(frozen=True)
class CacheEntry:
    reply: Reply
    latency_s: float  # how long the request took when it was made


def cache_key(base_url: str, request: ChatRequest, sample: int) -> str:
    """sha256 of the canonical JSON of what decides a reply."""
    material = {
        "v": _KEY_VERSION,
        "model": request.model,
        "base_url": base_url.rstrip("/"),
        "messages": [[m.role, m.content] for m in request.messages],
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "extra_body": dict(request.extra_body),
        "sample": sample,
    }
    blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class ResponseCache:
    """Replies by key in `directory/responses.sqlite`. Raises UsageError when it cannot be opened."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CACHE_FILE
        self._lock = threading.Lock()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise UsageError(f"Cannot open the response cache '{self.path}': {exc} "
                             "(use --cache-dir elsewhere, or --no-cache)") from exc

    def get(self, key: str) -> CacheEntry | None:
        """The stored reply for `key`, or None. Raises HarnessError when the database fails."""
        try:
            with self._lock:
                row = self._db.execute("SELECT reply, latency_s FROM replies_v1 WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise HarnessError(f"Response cache '{self.path}': {exc}") from exc
        return None if row is None else CacheEntry(reply=_reply_from_json(row[0]), latency_s=row[1])

    def put(self, key: str, model: str, reply: Reply, latency_s: float) -> None:
        """Store `reply` under `key`, replacing any older one. Raises HarnessError when the database fails."""
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO replies_v1 VALUES (?, ?, ?, ?, ?)",
                                 (key, model, _reply_to_json(reply), latency_s, time.time()))
                self._db.commit()
        except sqlite3.Error as exc:
            raise HarnessError(f"Response cache '{self.path}': {exc}") from exc

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies_v1").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _reply_to_json(reply: Reply) -> str:
    usage = None if reply.usage is None else [reply.usage.prompt_tokens, reply.usage.completion_tokens]
    return json.dumps({"text": reply.text, "usage": usage, "finish_reason": reply.finish_reason})


def _reply_from_json(blob: str) -> Reply:
    data = json.loads(blob)
    usage = None if data["usage"] is None else Usage(*data["usage"])
    return Reply(text=data["text"], usage=usage, finish_reason=data["finish_reason"])
