"""SIGTERM during requests: no new request is taken, the pair in flight that fits the drain's bound is
answered and stored, the one that does not is aborted (its client gets 503), no child is left, the
process exits 0, and every stored verdict is intact."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kbv.api import load_report
from kbv.problems import content_hash
from kbv.store import open_store
from serving import HANGS, HONEST, start, torch_candidate
from sources import children_under

pytestmark = pytest.mark.slow

DRAIN_S = 12.0
SLOW = ("import time\n" + torch_candidate("torch.relu(x)", "slow")).replace(
    "        return torch.relu(x)", "        time.sleep(0.01)\n        return torch.relu(x)")


def _wait_for_depth(http: httpx.Client, depth: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while http.get("/healthz").json()["queue"]["depth"] < depth:
        assert time.monotonic() < deadline, "the requests were never admitted"
        time.sleep(0.05)


def test_sigterm_finishes_what_fits_aborts_the_rest_and_leaves_no_child(tmp_path: Path):
    server = start(tmp_path, "--problems", "smoke", "--timeout", "120", "--drain-timeout", str(DRAIN_S),
                   "--cache-dir", str(tmp_path / "cache"))
    try:
        with httpx.Client(base_url=server.url, timeout=180) as http:
            def post(code: str) -> httpx.Response:
                return http.post("/v1/evaluate", json={"problem": "L1/2_ReLU", "code": code, "protocol": "standard"})

            assert post(HONEST).json()["status"] == "correct"  # stored before the signal; the problem prepared
            with ThreadPoolExecutor(max_workers=2) as pool:
                slow = pool.submit(post, SLOW)  # first in the lane: done within the bound
                _wait_for_depth(http, 1)
                hung = pool.submit(post, HANGS)  # behind it: still running when the bound runs out
                _wait_for_depth(http, 2)
                sent = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                try:  # no new request is taken: refused, or answered 503 if it slipped in
                    late = httpx.post(f"{server.url}/v1/evaluate", json={"problem": "L1/2_ReLU", "code": "x"}, timeout=10)
                    assert late.status_code == 503, late.text
                except httpx.TransportError:
                    pass
                assert slow.result().status_code == 200 and slow.result().json()["status"] == "correct"
                assert hung.result().status_code == 503 and "submit it again" in hung.result().json()["error"]
        assert server.proc.wait(60) == 0, server.errors()[-2000:]
        took = time.monotonic() - sent
        assert took < DRAIN_S + 15, f"exited {took:.1f} s after SIGTERM"
        assert "aborted 1 pairs" in server.errors() and "Traceback" not in server.errors()
        deadline = time.monotonic() + 3
        while children_under(server.run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children_under(server.run_dir) == [], "a child outlived the service"
        stored = {v.candidate_hash: v.status.value for v in load_report(server.run_dir).verdicts}
        assert stored == {content_hash(HONEST): "correct", content_hash(SLOW): "correct"}  # nothing of the aborted pair
        with open_store(server.run_dir, create=False) as store:
            assert [a["status"] for a in store.answers()] == ["correct", "correct"]
    finally:
        if server.proc.poll() is None:
            server.stop()
