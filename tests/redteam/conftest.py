"""Fixtures of the red-team tests. `kbv generate`'s loopback chat server (tests/generate/chat_server.py)
plays the hacker model; no proxy may divert its traffic and no real key may reach it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_GENERATE_TESTS = str(Path(__file__).resolve().parents[1] / "generate")
if _GENERATE_TESTS not in sys.path:
    sys.path.insert(0, _GENERATE_TESTS)  # chat_server, shared with the generate tests


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
