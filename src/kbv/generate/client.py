"""The LLM boundary: a chat client with one method, the retry policy around it, and a fake.

    ChatClient.complete(ChatRequest) -> Reply        raises ChatError
        OpenAIChatClient   any OpenAI-compatible endpoint (hosted APIs, vLLM, SGLang, Ollama), through
                           the `openai` SDK, imported only when the client is built
        FakeChatClient     scripted replies, for tests

The retrying is ours, not the SDK's (it is built with `max_retries=0`): `complete_with_retries` retries
transient failures (429, 408, 5xx, timeouts, connection errors) with exponential backoff and full jitter,
waits what a `Retry-After` header asks instead when there is one, and does not retry other refusals.

ChatError.kind says what a failure means for the run:
    TRANSIENT   retried; when retries run out, the sample is recorded as request_failed
    REJECTED    this request was refused (400, 413, 422, other 4xx): recorded as request_failed at once
    FATAL       the endpoint refuses this whole run (401, 403, 404: key, model or URL): the run stops
"""

from __future__ import annotations

import email.utils
import enum
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kbv.errors import UsageError

INSTALL_HINT = "pip install 'kernelbench-verified[generate]'"
_FATAL_STATUSES = frozenset({401, 403, 404})


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completion request. `None` sampling fields are not sent (the server's default)."""

    model: str
    messages: tuple[Message, ...]
    temperature: float | None = None
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # JSON fields merged into the body
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Reply:
    text: str  # the assistant message's content; "" when the server sent none
    usage: Usage | None = None  # None when the server did not report it
    finish_reason: str | None = None


class ErrorKind(str, enum.Enum):
    TRANSIENT = "transient"
    REJECTED = "rejected"
    FATAL = "fatal"


class ChatError(Exception):
    """A request that did not produce a reply. Raised by clients, handled by `complete_with_retries`."""

    def __init__(self, message: str, kind: ErrorKind, status_code: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class ChatClient(Protocol):
    def complete(self, request: ChatRequest) -> Reply:
        """The model's reply to `request`. Raises ChatError. Must be safe to call from several threads."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait. Delay before retry i (0-based) is uniform in
    [0, min(max_delay_s, base_delay_s * 2**i)], unless the server sent Retry-After."""

    max_retries: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    max_retry_after_s: float = 300.0  # a Retry-After longer than this is cut to it


@dataclass(frozen=True)
class Outcome:
    """What came of one request after retries: a reply, or the last error."""

    reply: Reply | None
    error: str | None
    attempts: int  # requests sent (1 + retries)
    latency_s: float  # duration of the last attempt


def classify_status(status_code: int) -> ErrorKind:
    """What an HTTP error status means for retrying and for the run."""
    if status_code == 429 or status_code == 408 or status_code >= 500:
        return ErrorKind.TRANSIENT
    if status_code in _FATAL_STATUSES:
        return ErrorKind.FATAL
    return ErrorKind.REJECTED


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date); None if absent."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
        if "retry-after" in lowered:
            return max(0.0, float(lowered["retry-after"]))
    except ValueError:
        pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, AttributeError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def backoff_delay_s(policy: RetryPolicy, retry_index: int, unit_random: float) -> float:
    """Full-jitter exponential backoff: `unit_random` (in [0, 1)) times the capped exponential."""
    ceiling = min(policy.max_delay_s, policy.base_delay_s * (2.0 ** retry_index))
    return unit_random * ceiling


def retry_delay_s(policy: RetryPolicy, retry_index: int, error: ChatError, unit_random: float) -> float:
    """The wait before retry `retry_index`: the server's Retry-After when given, else the backoff."""
    if error.retry_after_s is not None:
        return min(error.retry_after_s, policy.max_retry_after_s)
    return backoff_delay_s(policy, retry_index, unit_random)


def complete_with_retries(client: ChatClient, request: ChatRequest, policy: RetryPolicy,
                          sleep: Callable[[float], None] = time.sleep,
                          unit_random: Callable[[], float] = random.random) -> Outcome:
    """Send `request`, retrying transient failures per `policy`.

    Returns an Outcome with the reply, or with the error once retries are spent or the request was
    rejected. Re-raises a FATAL ChatError: the run, not this sample, is broken.
    """
    attempts = 0
    while True:
        attempts += 1
        started = time.monotonic()
        try:
            reply = client.complete(request)
        except ChatError as exc:
            latency = time.monotonic() - started
            if exc.kind is ErrorKind.FATAL:
                raise
            if exc.kind is ErrorKind.REJECTED or attempts > policy.max_retries:
                return Outcome(reply=None, error=str(exc), attempts=attempts, latency_s=latency)
            sleep(retry_delay_s(policy, attempts - 1, exc, unit_random()))
            continue
        return Outcome(reply=reply, error=None, attempts=attempts, latency_s=time.monotonic() - started)


class OpenAIChatClient:
    """A ChatClient over the `openai` SDK, for any OpenAI-compatible chat-completions endpoint."""

    def __init__(self, base_url: str, api_key: str) -> None:
        try:
            import openai
        except ImportError as exc:
            raise UsageError(f"kbv generate needs the openai package: {INSTALL_HINT}") from exc
        self._openai = openai
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    def complete(self, request: ChatRequest) -> Reply:
        try:
            response = self._client.chat.completions.create(**_sdk_arguments(request))
        except self._openai.OpenAIError as exc:
            raise _translate_error(self._openai, exc, request.timeout_s) from exc
        return _reply_from_response(response)

    def close(self) -> None:
        self._client.close()


def _sdk_arguments(request: ChatRequest) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "timeout": request.timeout_s,
    }
    if request.temperature is not None:
        args["temperature"] = request.temperature
    if request.max_tokens is not None:
        args["max_tokens"] = request.max_tokens
    if request.extra_body:
        args["extra_body"] = dict(request.extra_body)
    return args


def _translate_error(openai: Any, exc: Exception, timeout_s: float) -> ChatError:
    """The SDK's exception as a ChatError (timeout is checked first: it subclasses the connection error)."""
    if isinstance(exc, openai.APITimeoutError):
        return ChatError(f"timed out after {timeout_s:g} s", ErrorKind.TRANSIENT)
    if isinstance(exc, openai.APIConnectionError):
        return ChatError(f"connection error: {exc.__cause__ or exc}", ErrorKind.TRANSIENT)  # the socket's reason
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        body = getattr(exc, "body", None)
        detail = body.get("message") if isinstance(body, dict) else None  # the server's own words
        retry_after = parse_retry_after(dict(exc.response.headers))
        return ChatError(f"HTTP {status}: {detail or exc.message}", classify_status(status), status, retry_after)
    return ChatError(f"{type(exc).__name__}: {exc}", ErrorKind.REJECTED)


def _reply_from_response(response: Any) -> Reply:
    choices = getattr(response, "choices", None) or []
    if not choices:
        return Reply(text="", usage=_usage_of(response), finish_reason=None)
    choice = choices[0]
    content = getattr(choice.message, "content", None) if choice.message is not None else None
    return Reply(text=content or "", usage=_usage_of(response), finish_reason=choice.finish_reason)


def _usage_of(response: Any) -> Usage | None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    return Usage(prompt_tokens=int(usage.prompt_tokens or 0), completion_tokens=int(usage.completion_tokens or 0))


FakeResponse = Callable[[ChatRequest], "Reply | str | ChatError"]


class FakeChatClient:
    """Scripted replies for tests: a fixed text, or a function of the request returning a Reply, a text
    or a ChatError (which is raised). Records every request it gets."""

    def __init__(self, respond: FakeResponse | str) -> None:
        self._respond = respond
        self._lock = threading.Lock()
        self.calls: list[ChatRequest] = []

    def complete(self, request: ChatRequest) -> Reply:
        with self._lock:
            self.calls.append(request)
        result = self._respond if isinstance(self._respond, str) else self._respond(request)
        if isinstance(result, ChatError):
            raise result
        if isinstance(result, str):
            return Reply(text=result, usage=Usage(prompt_tokens=0, completion_tokens=0), finish_reason="stop")
        return result
