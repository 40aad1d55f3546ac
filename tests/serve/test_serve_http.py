"""`kbv serve` over HTTP, on one real server for the module (uvicorn on a free port, `--device cpu`,
the bundled smoke suite, a bearer token) and httpx as the client: every endpoint, every error code,
the token, answers from the store, 50 concurrent requests, candidates that crash or hang, both
protocols, RewardFunction, and `kbv report` reading the service's run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kbv.problems import content_hash
from kbv.reward import RewardFunction
from serving import EXAMPLES, HANGS, HONEST, KILLS_ITSELF, WRONG, Served, kbv_env, start, torch_candidate

pytestmark = pytest.mark.slow

TOKEN = "t0k3n-for-the-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_CODE = 64 << 10
MAX_BATCH = 64


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("serve")
    server = start(root, "--problems", "smoke", "--token-env", "KBV_TEST_TOKEN", "--timeout", "20",
                   "--timer-budget", "1", "--trials", "1", "--cache-dir", str(root / "cache"),
                   "--max-code-bytes", str(MAX_CODE), "--max-batch", str(MAX_BATCH), "--max-queue", "256",
                   env=kbv_env(KBV_TEST_TOKEN=TOKEN))
    try:
        yield server
    finally:
        assert server.stop() == 0, server.errors()[-2000:]


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=300) as client:
        yield client


def _evaluate(http: httpx.Client, problem: str, code: str, protocol: str = "standard") -> dict:
    response = http.post("/v1/evaluate", json={"problem": problem, "code": code, "protocol": protocol})
    assert response.status_code == 200, response.text
    return response.json()


def test_healthz_says_the_device_the_problems_the_queue_and_the_counts_without_a_token(served):
    health = httpx.get(f"{served.url}/healthz", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["device"] == "cpu" and "L1/2_ReLU" in body["problems"]
    assert body["queue"] == {"depth": 0, "max": 256} and body["protocols"] == ["standard", "verified"]
    assert body["limits"]["max_code_bytes"] == MAX_CODE and body["reward"]["name"] == "kernelbench-rl"
    assert isinstance(body["pairs_evaluated"], int) and body["run"] == str(served.run_dir.resolve())


@pytest.mark.parametrize("headers, message", [
    ({}, "missing bearer token"), ({"Authorization": "Bearer nope"}, "wrong bearer token"),
    ({"Authorization": f"Basic {TOKEN}"}, "missing bearer token"),
])
def test_v1_needs_the_bearer_token(served, headers, message):
    for path, body in (("/v1/evaluate", {"problem": "L1/2_ReLU", "code": HONEST}), ("/v1/evaluate_batch", {})):
        response = httpx.post(f"{served.url}{path}", json=body, headers=headers, timeout=10)
        assert response.status_code == 401 and response.json()["error"].startswith(message)
        assert response.headers["www-authenticate"] == "Bearer"


def test_errors_are_one_line_of_json_with_their_codes(http):
    def refused(method: str, path: str, status: int, **kw) -> str:
        response = http.request(method, path, **kw)
        assert response.status_code == status, response.text
        assert list(response.json()) == ["error"] and "\n" not in response.json()["error"]
        return response.json()["error"]

    assert refused("POST", "/v1/evaluate", 400, content=b'{"problem": "L1/2_ReLU", "code": ').startswith("malformed JSON")
    assert refused("POST", "/v1/evaluate", 400, json={"problem": "L1/2_ReLU"}) == "missing field 'code'"
    assert refused("POST", "/v1/evaluate_batch", 400, json={"items": [{"code": "x"}]}) == "items[0]: missing field 'problem'"
    unknown = refused("POST", "/v1/evaluate", 404, json={"problem": "L1/2_ReLUU", "code": HONEST})
    assert unknown.startswith("unknown problem 'L1/2_ReLUU'. Did you mean L1/2_ReLU")
    big = refused("POST", "/v1/evaluate", 413, json={"problem": "L1/2_ReLU", "code": HONEST + "#" * MAX_CODE})
    assert "over the limit of 65536" in big
    items = [{"problem": "L1/2_ReLU", "code": HONEST}] * (MAX_BATCH + 1)
    assert "over the limit of 64" in refused("POST", "/v1/evaluate_batch", 413, json={"items": items})
    assert refused("GET", "/v2/evaluate", 404) == "no such endpoint: GET /v2/evaluate"
    assert refused("GET", "/v1/evaluate", 405).endswith("GET /v1/evaluate")


def test_an_honest_kernel_is_correct_and_its_resubmission_comes_from_the_store(http, served):
    first = _evaluate(http, "L1/2_ReLU", HONEST)
    verdict = first["verdict"]
    assert first["status"] == verdict["status"] == "correct" and first["cached"] is False
    assert first["reward"] == pytest.approx(0.3 + first["speedup"]) and first["speedup"] > 0
    assert first["reward_rule"] == {"name": "kernelbench-rl", "version": 1}
    assert verdict["candidate_hash"] == content_hash(HONEST) and verdict["problem"] == "L1/2_ReLU"
    evaluated = http.get("/healthz").json()["pairs_evaluated"]
    latencies = []
    for _ in range(20):
        t0 = time.perf_counter()
        again = _evaluate(http, "L1/2_ReLU", HONEST)
        latencies.append(time.perf_counter() - t0)
        assert again["cached"] is True and again["verdict"] == verdict
    assert http.get("/healthz").json()["pairs_evaluated"] == evaluated  # nothing ran again
    assert sorted(latencies)[-2] < 0.5, latencies  # a cached answer is a look-up (the bench measures p99)
    report = subprocess.run([sys.executable, "-m", "kbv", "report", str(served.run_dir), "--format", "json"],
                            env=kbv_env(), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    stored = [v for v in json.loads(report.stdout)["verdicts"] if v["candidate_hash"] == content_hash(HONEST)]
    assert [(v["problem"], v["protocol"], v["status"]) for v in stored] == [("L1/2_ReLU", "standard", "correct")]


def test_fifty_concurrent_requests_are_each_answered_correctly_and_identical_ones_run_once(http):
    pairs = [(problem, torch_candidate(body, f"{kind} {n}"), expected)
             for problem, honest in (("L1/2_ReLU", "torch.relu(x)"), ("L1/5_Sigmoid", "torch.sigmoid(x)"))
             for kind, body, expected, count in (("honest", honest, "correct", 2), ("wrong", "x * 0.5", "incorrect", 1))
             for n in range(count)]
    requests = [pairs[i % len(pairs)] for i in range(50)]
    before = http.get("/healthz").json()["pairs_evaluated"]
    barrier = threading.Barrier(50)

    def ask(item: tuple[str, str, str]) -> tuple[tuple[str, str, str], dict]:
        barrier.wait(30)  # all fifty at once
        return item, _evaluate(http, item[0], item[1])

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(ask, requests))
    for (problem, code, expected), answer in answers:
        assert answer["problem"] == problem and answer["verdict"]["candidate_hash"] == content_hash(code)
        assert answer["status"] == expected and (answer["reward"] > 0) == (expected == "correct")
    health = http.get("/healthz").json()
    assert health["pairs_evaluated"] - before == len(pairs) == 6  # the other 44 joined a job or came from the store
    assert health["queue"]["depth"] == 0


def test_a_child_that_kills_itself_or_hangs_is_a_verdict_and_the_server_still_answers(http, served):
    with ThreadPoolExecutor(max_workers=2) as pool:
        crashed = pool.submit(_evaluate, http, "L1/2_ReLU", KILLS_ITSELF)
        hung = pool.submit(_evaluate, http, "L1/2_ReLU", HANGS)
        while not hung.done():  # the service answers while a child hangs
            t0 = time.perf_counter()
            assert httpx.get(f"{served.url}/healthz", timeout=5).status_code == 200
            assert time.perf_counter() - t0 < 2.0
            time.sleep(0.5)
        assert crashed.result()["status"] == "crashed" and crashed.result()["reward"] == 0.0
        assert hung.result()["status"] == "timeout" and hung.result()["reward"] == 0.0
    assert _evaluate(http, "L1/2_ReLU", WRONG)["status"] == "incorrect"  # and goes on evaluating


def test_a_triton_kernel_verifies_and_under_both_a_torch_one_earns_nothing(http):
    # (the standard protocol's 100 timed calls through Triton's interpreter would take ~10 s here)
    triton = _evaluate(http, "L1/2_ReLU", (EXAMPLES / "2_ReLU__triton.py").read_text(), "verified")
    assert triton["status"] == "verified" and triton["verdict"]["protocol"] == "verified", triton["verdict"]["message"]
    assert triton["reward"] == pytest.approx(0.3 + triton["speedup"]) and "standard" not in triton
    torch_level = _evaluate(http, "L1/2_ReLU", HONEST, "both")  # correct, but no custom kernel ran
    assert torch_level["status"] == "no_custom_kernel" and torch_level["reward"] == 0.0
    assert torch_level["standard"]["status"] == "correct" and torch_level["cached"] is False  # standard stored, verified new


def test_reward_function_against_the_live_server(served, http):
    reward = RewardFunction(served.url, token=TOKEN, protocol="standard")
    sigmoid = torch_candidate("torch.sigmoid(x)", "reward function")
    completions = [f"Here it is:\n```python\n{sigmoid}```\n", "I would rather not.",
                   [{"role": "assistant", "content": f"```py\n{WRONG}```"}],
                   f"Two tries:\n```python\n{WRONG}```\nbetter:\n```python\n{sigmoid}```"]
    answers_before = http.get("/healthz").json()["answers"]
    rewards = reward(completions, prompts=["p"] * 4, problem=["L1/5_Sigmoid"] * 4)
    direct = _evaluate(http, "L1/5_Sigmoid", sigmoid)
    assert rewards[0] == rewards[3] == direct["reward"] > 0.3 and direct["cached"]
    assert rewards[1] == 0.0 and rewards[2] == 0.0
    assert reward.last_answers[1] is None and reward.last_answers[2].status == "incorrect"
    assert http.get("/healthz").json()["answers"] - answers_before == 3  # two from the batch, one direct
    assert reward.compute_score("kbv", completions[0], "L1/5_Sigmoid") == direct["reward"]  # verl's call
    reward.close()
