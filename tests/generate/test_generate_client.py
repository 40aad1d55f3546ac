"""The retry policy (pure, through the fake) and the OpenAI-SDK client against the loopback server."""

from __future__ import annotations

import time

import pytest
from chat_server import ChatServer, Scripted

from kbv.generate.client import (ChatError, ChatRequest, ErrorKind, FakeChatClient, Message, Reply, RetryPolicy,
                                 Usage, backoff_delay_s, classify_status, complete_with_retries, parse_retry_after,
                                 retry_delay_s)

FAST = RetryPolicy(max_retries=3, base_delay_s=0.001, max_delay_s=0.004)
CODE = "```python\nclass ModelNew:\n    pass\n```"


def request(model: str = "good", timeout_s: float = 5.0, **kwargs) -> ChatRequest:
    return ChatRequest(model=model, messages=(Message("user", "write ModelNew"),), timeout_s=timeout_s, **kwargs)


# --- the policy, pure -------------------------------------------------------------------------------

def test_backoff_is_full_jitter_and_capped():
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0)
    assert backoff_delay_s(policy, 0, 0.0) == 0.0
    assert backoff_delay_s(policy, 0, 0.5) == 0.5
    assert backoff_delay_s(policy, 2, 0.5) == 2.0  # 0.5 * 1 * 2**2
    assert backoff_delay_s(policy, 10, 0.999) == pytest.approx(9.99)  # capped at 10


def test_retry_after_wins_and_is_capped():
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0, max_retry_after_s=30.0)
    assert retry_delay_s(policy, 0, ChatError("slow down", ErrorKind.TRANSIENT, 429, retry_after_s=7.0), 0.1) == 7.0
    assert retry_delay_s(policy, 0, ChatError("slow down", ErrorKind.TRANSIENT, 429, retry_after_s=99.0), 0.1) == 30.0
    assert retry_delay_s(policy, 1, ChatError("oops", ErrorKind.TRANSIENT, 500), 0.5) == 1.0


@pytest.mark.parametrize("status, kind", [
    (429, ErrorKind.TRANSIENT), (408, ErrorKind.TRANSIENT), (500, ErrorKind.TRANSIENT), (503, ErrorKind.TRANSIENT),
    (400, ErrorKind.REJECTED), (413, ErrorKind.REJECTED), (422, ErrorKind.REJECTED),
    (401, ErrorKind.FATAL), (403, ErrorKind.FATAL), (404, ErrorKind.FATAL),
])
def test_classify_status(status, kind):
    assert classify_status(status) is kind


def test_parse_retry_after():
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "0.25"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0) == 10.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None


def scripted(*results):
    """A fake that answers with `results` in turn (the last repeats)."""
    calls = []

    def respond(req):
        calls.append(req)
        return results[min(len(calls), len(results)) - 1]

    return FakeChatClient(respond)


def test_transient_then_success():
    sleeps: list[float] = []
    client = scripted(ChatError("HTTP 503", ErrorKind.TRANSIENT, 503), Reply(text=CODE, usage=Usage(3, 4)))
    outcome = complete_with_retries(client, request(), FAST, sleep=sleeps.append, unit_random=lambda: 1.0)
    assert outcome.reply.text == CODE and outcome.attempts == 2 and outcome.error is None
    assert sleeps == [0.001]


def test_retries_run_out():
    sleeps: list[float] = []
    client = scripted(ChatError("HTTP 500: boom", ErrorKind.TRANSIENT, 500))
    outcome = complete_with_retries(client, request(), FAST, sleep=sleeps.append, unit_random=lambda: 1.0)
    assert outcome.reply is None and outcome.attempts == 4 and "500" in outcome.error
    assert sleeps == [0.001, 0.002, 0.004]  # doubling, then the cap


def test_rejected_is_not_retried():
    client = scripted(ChatError("HTTP 400: context too long", ErrorKind.REJECTED, 400))
    outcome = complete_with_retries(client, request(), FAST, sleep=pytest.fail)
    assert outcome.attempts == 1 and "400" in outcome.error and len(client.calls) == 1


def test_fatal_propagates():
    client = scripted(ChatError("HTTP 401: bad key", ErrorKind.FATAL, 401))
    with pytest.raises(ChatError, match="bad key"):
        complete_with_retries(client, request(), FAST, sleep=pytest.fail)


# --- the SDK against the loopback server ------------------------------------------------------------

@pytest.fixture
def sdk_client(chat_server: ChatServer):
    pytest.importorskip("openai")
    from kbv.generate.client import OpenAIChatClient

    client = OpenAIChatClient(base_url=chat_server.url, api_key="sk-test")
    yield client
    client.close()


def test_good_reply(sdk_client, chat_server):
    chat_server.on("good", Scripted(content=CODE, usage=(12, 34), finish_reason="length"))
    reply = sdk_client.complete(request(temperature=0.5, max_tokens=100, extra_body={"reasoning_effort": "high"}))
    assert reply == Reply(text=CODE, usage=Usage(12, 34), finish_reason="length")
    (body,) = chat_server.requests
    assert body["model"] == "good" and body["messages"] == [{"role": "user", "content": "write ModelNew"}]
    assert body["temperature"] == 0.5 and body["max_tokens"] == 100 and body["reasoning_effort"] == "high"
    assert chat_server.headers[0]["authorization"] == "Bearer sk-test"


def test_unset_sampling_is_not_sent(sdk_client, chat_server):
    chat_server.on("good", Scripted(content=None, usage=None))
    assert sdk_client.complete(request()) == Reply(text="", usage=None, finish_reason="stop")
    assert "temperature" not in chat_server.requests[0] and "max_tokens" not in chat_server.requests[0]


def test_429_then_success(sdk_client, chat_server):
    chat_server.on("flaky", Scripted(status=429, headers={"Retry-After": "0"}), CODE)
    outcome = complete_with_retries(sdk_client, request("flaky"), FAST)
    assert outcome.reply.text == CODE and outcome.attempts == 2
    assert len(chat_server.requests_for("flaky")) == 2


def test_retry_after_is_respected(sdk_client, chat_server):
    chat_server.on("flaky", Scripted(status=429, headers={"Retry-After": "0.3"}), CODE)
    started = time.monotonic()
    outcome = complete_with_retries(sdk_client, request("flaky"), FAST)
    assert outcome.reply is not None and time.monotonic() - started >= 0.3


def test_500_until_retries_run_out(sdk_client, chat_server):
    chat_server.on("broken", Scripted(status=500, content="upstream exploded"))
    outcome = complete_with_retries(sdk_client, request("broken"), FAST)
    assert outcome.reply is None and outcome.attempts == 4
    assert "500" in outcome.error and "upstream exploded" in outcome.error
    assert len(chat_server.requests_for("broken")) == 4


def test_400_is_not_retried(sdk_client, chat_server):
    chat_server.on("strict", Scripted(status=400, content="prompt too long"))
    outcome = complete_with_retries(sdk_client, request("strict"), FAST)
    assert outcome.attempts == 1 and "400" in outcome.error
    assert len(chat_server.requests_for("strict")) == 1


def test_unknown_model_is_fatal(sdk_client, chat_server):
    with pytest.raises(ChatError) as info:
        sdk_client.complete(request("no-such-model"))
    assert info.value.kind is ErrorKind.FATAL and info.value.status_code == 404


def test_slow_reply_times_out_and_is_retried(sdk_client, chat_server):
    chat_server.on("slow", Scripted(content=CODE, delay_s=1.0))
    started = time.monotonic()
    outcome = complete_with_retries(sdk_client, request("slow", timeout_s=0.2), RetryPolicy(1, 0.001, 0.001))
    assert outcome.reply is None and outcome.attempts == 2 and "timed out" in outcome.error
    assert time.monotonic() - started < 0.9  # neither attempt waited for the slow reply


def test_connection_refused_is_transient(chat_server):
    pytest.importorskip("openai")
    from kbv.generate.client import OpenAIChatClient

    url = chat_server.url
    chat_server.close()  # nothing listens on the port any more
    client = OpenAIChatClient(base_url=url, api_key="sk-test")
    with pytest.raises(ChatError) as info:
        client.complete(request(timeout_s=2.0))
    assert info.value.kind is ErrorKind.TRANSIENT and "connection" in str(info.value).lower()
    client.close()
