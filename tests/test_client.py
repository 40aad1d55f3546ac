"""`kbv.client.Client` against a scripted transport: answers parsed into Verdicts, errors raised with
the service's status and message, a full queue retried as Retry-After asks, an unreachable service."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from kbv.answer import Answer
from kbv.client import Client
from kbv.errors import ServiceError
from kbv.reward_rules import reward_rule
from kbv.verdict import Status, Verdict

VERDICT = Verdict(problem="L1/2_ReLU", problem_hash="ph", level=1, candidate="2_ReLU__abc", candidate_hash="ch",
                  protocol="verified", protocol_version="v", status=Status.VERIFIED, speedup=1.25)
STANDARD = Verdict(problem="L1/2_ReLU", problem_hash="ph", level=1, candidate="2_ReLU__abc", candidate_hash="ch",
                   protocol="standard", protocol_version="s", status=Status.CORRECT, speedup=3.0)


def _answer(protocol: str = "verified") -> dict:
    verdicts = {"verified": VERDICT, "standard": STANDARD} if protocol == "both" else {"verified": VERDICT}
    return Answer.of("L1/2_ReLU", protocol, verdicts, reward_rule("kernelbench-rl"), cached=False).to_dict()


def _client(handler, **kw) -> Client:
    return Client("http://kbv.test", token="s3cret", transport=httpx.MockTransport(handler), **kw)


def test_evaluate_sends_the_item_and_the_token_and_reads_the_answer():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers["authorization"], json.loads(request.content)))
        return httpx.Response(200, json=_answer("both"))

    answer = _client(handler).evaluate("L1/2_ReLU", "code", protocol="both")
    assert seen == [("/v1/evaluate", "Bearer s3cret", {"problem": "L1/2_ReLU", "code": "code", "protocol": "both"})]
    assert answer.status == "verified" and answer.speedup == 1.25 and answer.reward == pytest.approx(1.55)
    assert answer.verdicts["standard"] == STANDARD and answer.verdict == VERDICT


def test_a_batch_takes_mappings_and_tuples_and_keeps_order():
    def handler(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        assert items == [{"problem": "a", "code": "x"}, {"problem": "b", "code": "y", "protocol": "standard"}]
        return httpx.Response(200, json={"items": [_answer(), _answer()]})

    assert len(_client(handler).evaluate_batch([{"problem": "a", "code": "x"}, ("b", "y", "standard")])) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 413, 500])
def test_a_refusal_raises_with_the_service_s_status_and_message_at_once(status):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, json={"error": f"refused {status}"})

    with pytest.raises(ServiceError) as refused:
        _client(handler).evaluate("p", "c")
    assert refused.value.status == status and str(refused.value) == f"refused {status}" and len(calls) == 1


def test_a_full_queue_is_retried_after_what_the_service_asks_then_answered():
    replies = [httpx.Response(429, json={"error": "full"}, headers={"Retry-After": "0.05"}),
               httpx.Response(503, json={"error": "starting"}, headers={"Retry-After": "0"}),
               httpx.Response(200, json=_answer())]
    t0 = time.monotonic()
    answer = _client(lambda request: replies.pop(0)).evaluate("p", "c")
    assert answer.status == "verified" and replies == [] and time.monotonic() - t0 >= 0.05


def test_retries_stop_at_retry_s_with_the_last_refusal():
    handler = lambda request: httpx.Response(429, json={"error": "the queue is full"}, headers={"Retry-After": "0.2"})  # noqa: E731
    with pytest.raises(ServiceError, match="the queue is full") as refused:
        _client(handler, retry_s=0.5).evaluate("p", "c")
    assert refused.value.status == 429


def test_an_unreachable_service_is_a_service_error_without_a_status():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ServiceError, match="cannot reach kbv serve") as unreachable:
        _client(handler, retry_s=0.3).health()
    assert unreachable.value.status is None


def test_an_answer_of_another_shape_is_said_so():
    with pytest.raises(ServiceError, match="an answer this kbv cannot read"):
        _client(lambda request: httpx.Response(200, json={"status": "ok"})).evaluate("p", "c")
