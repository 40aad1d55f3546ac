"""Fixtures for kbv.generate: the loopback chat server (see chat_server.py) and tiny problems."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_server import ADD_BIAS, DOUBLE, ChatServer, honest_reply


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy may divert loopback traffic; no real key may leak into a test."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def problem_dir(tmp_path: Path) -> Path:
    """Two KernelBench-format problems: level1/1_Double.py and level1/2_AddBias.py."""
    root = tmp_path / "problems"
    (root / "level1").mkdir(parents=True)
    (root / "level1" / "1_Double.py").write_text(DOUBLE)
    (root / "level1" / "2_AddBias.py").write_text(ADD_BIAS)
    return root


@pytest.fixture
def honest() -> Callable[[dict[str, Any]], str]:
    return honest_reply
