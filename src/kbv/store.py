"""The results database: one SQLite file per run directory, the source of truth.

Every verdict is committed the moment it exists (WAL journal), so a run killed with SIGKILL loses
nothing already written, and re-running the same command skips pairs whose key is present. The key
covers the problem and candidate hashes, the candidate's identity, the protocol's rules and the
device, so a change to any of them is evaluated anew.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kbv.errors import StoreError
from kbv.verdict import SCHEMA_VERSION, ProblemFailure, Verdict

DB_NAME = "kbv.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS invocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, config TEXT NOT NULL,
    provenance TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, problem TEXT NOT NULL, problem_hash TEXT NOT NULL,
    level INTEGER, candidate TEXT NOT NULL, candidate_hash TEXT NOT NULL, model TEXT, sample INTEGER,
    protocol TEXT NOT NULL, protocol_version TEXT NOT NULL, status TEXT NOT NULL, speedup REAL,
    created_at TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pair_failures (
    key TEXT PRIMARY KEY, problem_hash TEXT NOT NULL, protocol TEXT NOT NULL, problem TEXT NOT NULL,
    message TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, problem TEXT NOT NULL,
    candidate_hash TEXT NOT NULL, protocol TEXT NOT NULL, keys TEXT NOT NULL, status TEXT NOT NULL,
    reward REAL NOT NULL, reward_rule TEXT NOT NULL, reward_version INTEGER NOT NULL, cached INTEGER NOT NULL);
"""


def pair_key(problem_hash: str, candidate_hash: str, candidate_name: str, model: str | None,
             sample: int | None, protocol_fingerprint: str, device_fingerprint: str) -> str:
    """The resume key of one (problem, candidate, protocol, device)."""
    parts = [problem_hash, candidate_hash, candidate_name, model or "", str(sample),
             protocol_fingerprint, device_fingerprint]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


class Store:
    """Thread-safe access to one run database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the results database: {exc}") from exc
        self._lock = threading.Lock()
        self._check_schema()

    def _check_schema(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: written by schema {row[0]}, this kbv reads schema {SCHEMA_VERSION}")

    # -- verdicts -------------------------------------------------------------------------------
    def keys(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT key FROM verdicts")}

    def put_verdict(self, key: str, verdict: Verdict) -> None:
        """Store `verdict` under `key`; a failure of its problem stored earlier for this pair is over."""
        data = json.dumps(verdict.to_dict())
        with self._lock, self._db:
            self._db.execute("BEGIN")
            seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM verdicts").fetchone()[0]
            self._db.execute(
                "INSERT OR REPLACE INTO verdicts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (key, seq, verdict.problem, verdict.problem_hash, verdict.level, verdict.candidate,
                 verdict.candidate_hash, verdict.model, verdict.sample, verdict.protocol,
                 verdict.protocol_version, verdict.status.value, verdict.speedup, _now(), data))
            self._db.execute("DELETE FROM pair_failures WHERE key=?", (key,))

    # -- problem failures -----------------------------------------------------------------------
    def put_problem_failure(self, key: str, failure: ProblemFailure) -> None:
        """The pair of `key` has no verdict: its problem failed (`failure`, under its protocol). It
        stands until that pair's own verdict is stored; a resumed run tries the pair again."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO pair_failures VALUES (?,?,?,?,?,?)",
                             (key, failure.problem_hash, failure.protocol, failure.problem, failure.message, _now()))

    def problem_failures(self) -> list[ProblemFailure]:
        """The standing failures, one per problem and protocol (how many pairs it left without a verdict,
        the latest reason), in the order they first happened."""
        with self._lock:
            rows = self._db.execute("SELECT problem, problem_hash, protocol, message, created_at "
                                    "FROM pair_failures ORDER BY rowid").fetchall()
        grouped: dict[tuple[str, str], ProblemFailure] = {}
        for problem, problem_hash, protocol, message, created_at in rows:
            seen = grouped.get((problem_hash, protocol))
            grouped[(problem_hash, protocol)] = ProblemFailure(problem, message, protocol, problem_hash,
                                                               (seen.pairs + 1) if seen else 1, created_at)
        return list(grouped.values())

    def verdicts(self, keys: Iterable[str] | None = None) -> list[Verdict]:
        """Verdicts in the order they were written (all of them, or those of `keys`)."""
        with self._lock:
            rows = self._db.execute("SELECT key, data FROM verdicts ORDER BY seq").fetchall()
        wanted = set(keys) if keys is not None else None
        return [Verdict.from_dict(json.loads(d)) for k, d in rows if wanted is None or k in wanted]

    def get_verdicts(self, keys: Iterable[str]) -> dict[str, Verdict]:
        """The stored verdicts of those `keys` that have one (an indexed look-up, whatever the
        store's size: `kbv serve` asks it for every request)."""
        return {k: Verdict.from_dict(d) for k, d in self.get_verdict_data(keys).items()}

    def get_verdict_data(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """`get_verdicts` as the stored JSON (`Verdict.to_dict`), for a caller that sends it on."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        for i in range(0, len(wanted), 500):  # within SQLite's limit on bound parameters
            chunk = wanted[i:i + 500]
            with self._lock:
                rows = self._db.execute(f"SELECT key, data FROM verdicts WHERE key IN ({','.join('?' * len(chunk))})",
                                        chunk).fetchall()
            found.update((k, json.loads(d)) for k, d in rows)
        return found

    def verdicts_of(self, keys: Iterable[str]) -> list[Verdict]:
        """The verdicts of `keys`, in the order of `keys` (a key without one is left out)."""
        with self._lock:
            rows = dict(self._db.execute("SELECT key, data FROM verdicts").fetchall())
        return [Verdict.from_dict(json.loads(rows[k])) for k in keys if k in rows]

    # -- answers (kbv serve) ------------------------------------------------------------------------
    def put_answer(self, answer: dict[str, Any]) -> None:
        """One answer `kbv serve` gave: {problem, candidate_hash, protocol, keys (its verdicts'),
        status, reward, reward_rule, reward_version, cached}. The verdicts are stored apart, once."""
        row = (_now(), answer["problem"], answer["candidate_hash"], answer["protocol"], json.dumps(answer["keys"]),
               answer["status"], float(answer["reward"]), answer["reward_rule"], int(answer["reward_version"]),
               int(bool(answer["cached"])))
        with self._lock:
            self._db.execute("INSERT INTO answers (created_at, problem, candidate_hash, protocol, keys, status, "
                             "reward, reward_rule, reward_version, cached) VALUES (?,?,?,?,?,?,?,?,?,?)", row)

    def answers(self) -> list[dict[str, Any]]:
        """Every answer given, in order (see `put_answer`), each with its `created_at`."""
        with self._lock:
            rows = self._db.execute("SELECT created_at, problem, candidate_hash, protocol, keys, status, reward, "
                                    "reward_rule, reward_version, cached FROM answers ORDER BY id").fetchall()
        names = ("created_at", "problem", "candidate_hash", "protocol", "keys", "status", "reward", "reward_rule",
                 "reward_version", "cached")
        out = [dict(zip(names, r)) for r in rows]
        for a in out:
            a["keys"], a["cached"] = json.loads(a["keys"]), bool(a["cached"])
        return out

    # -- invocations ----------------------------------------------------------------------------
    def record_invocation(self, config: dict[str, Any], provenance: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT INTO invocations (started_at, config, provenance) VALUES (?,?,?)",
                             (_now(), json.dumps(config, default=str), json.dumps(provenance, default=str)))

    def invocations(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT started_at, config, provenance FROM invocations ORDER BY id").fetchall()
        return [{"started_at": s, "config": json.loads(c), "provenance": json.loads(p)} for s, c, p in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(run_dir: Path, create: bool = True) -> Store:
    """The store of `run_dir`. With create=False, a missing database is a StoreError."""
    path = Path(run_dir) / DB_NAME
    if not create and not path.exists():
        raise StoreError(f"No kbv run at '{run_dir}' (no {DB_NAME} there).")
    return Store(path)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
