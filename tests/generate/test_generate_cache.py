"""The SQLite response cache (kbv.generate.cache)."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from pathlib import Path

import pytest

from kbv.errors import UsageError
from kbv.generate.cache import CACHE_FILE, ResponseCache, cache_key
from kbv.generate.client import ChatRequest, Message, Reply, Usage

URL = "http://127.0.0.1:8000/v1"
REQUEST = ChatRequest(model="m", messages=(Message("user", "write ModelNew"),), temperature=0.7, max_tokens=512,
                      extra_body={"reasoning_effort": "high"}, timeout_s=60.0)


def test_key_is_stable():
    assert cache_key(URL, REQUEST, 0) == cache_key(URL, dataclasses.replace(REQUEST), 0)
    assert cache_key(URL, REQUEST, 0) == cache_key(URL + "/", REQUEST, 0)


@pytest.mark.parametrize("change", [
    {"model": "other"},
    {"messages": (Message("user", "write ModelNew!"),)},
    {"messages": (Message("system", "be brief"), Message("user", "write ModelNew"))},
    {"temperature": 0.8},
    {"temperature": None},
    {"max_tokens": 513},
    {"extra_body": {"reasoning_effort": "low"}},
    {"extra_body": {}},
])
def test_key_covers_what_decides_the_reply(change):
    assert cache_key(URL, REQUEST, 0) != cache_key(URL, dataclasses.replace(REQUEST, **change), 0)


def test_key_covers_base_url_and_sample():
    key = cache_key(URL, REQUEST, 0)
    assert key != cache_key("http://127.0.0.1:8001/v1", REQUEST, 0)
    assert key != cache_key(URL, REQUEST, 1)


def test_key_ignores_timeout():
    assert cache_key(URL, REQUEST, 0) == cache_key(URL, dataclasses.replace(REQUEST, timeout_s=5.0), 0)


def test_round_trip_and_persistence(tmp_path: Path):
    reply = Reply(text="```python\nclass ModelNew: ...\n```", usage=Usage(10, 20), finish_reason="stop")
    with ResponseCache(tmp_path) as cache:
        assert cache.get("k") is None
        cache.put("k", "m", reply, latency_s=1.5)
        cache.put("no-usage", "m", Reply(text="hi"), latency_s=0.1)
    with ResponseCache(tmp_path) as cache:
        entry = cache.get("k")
        assert entry is not None and entry.reply == reply and entry.latency_s == 1.5
        assert cache.get("no-usage").reply == Reply(text="hi")
        assert len(cache) == 2


def test_wal_mode(tmp_path: Path):
    ResponseCache(tmp_path).close()
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_threads_and_two_connections(tmp_path: Path):
    first, second = ResponseCache(tmp_path), ResponseCache(tmp_path)  # as two processes would

    def work(cache: ResponseCache, worker: int) -> None:
        for i in range(25):
            cache.put(f"{worker}-{i}", "m", Reply(text=f"{worker}/{i}"), latency_s=0.0)
            assert cache.get(f"{worker}-{i}") is not None

    threads = [threading.Thread(target=work, args=(first if w % 2 else second, w)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(first) == len(second) == 200
    assert second.get("3-24").reply.text == "3/24"
    first.close()
    second.close()


def test_unusable_directory(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UsageError, match="--no-cache"):
        ResponseCache(blocker)
