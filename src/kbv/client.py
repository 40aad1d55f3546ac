"""A client of `kbv serve`, on httpx (the `serve` extra).

    from kbv.client import Client

    with Client("http://127.0.0.1:8000", token=os.environ.get("KBV_TOKEN")) as kbv:
        answer = kbv.evaluate("L1/2_ReLU", code, protocol="verified")
        print(answer.status, answer.speedup, answer.reward, answer.verdict.message)
        answers = kbv.evaluate_batch([{"problem": "L1/2_ReLU", "code": code}, ("L1/4_GELU", other)])

Answers are `kbv.answer.Answer` records holding `kbv.verdict.Verdict`s. Every request is
idempotent (an identical one is answered from the store, or joins the one in flight), so a full queue
(429), a service that is stopping or starting (503, a refused or dropped connection) is retried with
exponential backoff for up to `retry_s` seconds. Anything else the service refuses raises
ServiceError with its status and message; a service that stays unreachable raises it with status None.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kbv.errors import ServiceError, UsageError
from kbv.answer import Answer

INSTALL_HINT = "pip install 'kernelbench-verified[serve]'"
_RETRIED = frozenset({429, 503})


class Client:
    """`url` of a `kbv serve`; `token` its bearer token (None where it has none). `timeout_s` bounds
    one request, the evaluation included (a large batch on one GPU takes a while)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 3600.0, retry_s: float = 120.0,
                 transport: Any = None) -> None:
        try:
            import httpx
        except ImportError:
            raise UsageError(f"kbv.client needs httpx: {INSTALL_HINT}") from None
        self._httpx = httpx
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry_s = retry_s
        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)))

    def health(self) -> dict[str, Any]:
        """What GET /healthz says: device, problems, queue, counts, reward rule, limits."""
        return dict(self._request("GET", "/healthz"))

    def evaluate(self, problem: str, code: str, protocol: str = "verified") -> Answer:
        """The answer for `code` as a candidate of `problem` under `protocol` (standard, verified, both)."""
        return self._answer(self._request("POST", "/v1/evaluate", {"problem": problem, "code": code,
                                                                   "protocol": protocol}))

    def evaluate_batch(self, items: Iterable[Mapping[str, str] | Sequence[str]]) -> list[Answer]:
        """The answers for `items`, in order: each {"problem", "code", "protocol"?} or a tuple
        (problem, code[, protocol]). One request: the service admits the batch whole or refuses it."""
        body = {"items": [_item(item) for item in items]}
        data = self._request("POST", "/v1/evaluate_batch", body)
        return [self._answer(a) for a in data.get("items", ())]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire -------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, json=body)
            except (self._httpx.ConnectError, self._httpx.RemoteProtocolError) as exc:
                error, wait_s = ServiceError(None, f"{self.url}: cannot reach kbv serve: {exc}"), None
            except self._httpx.TimeoutException as exc:
                raise ServiceError(None, f"{self.url}{path}: no answer in time ({type(exc).__name__}); "
                                         "raise timeout_s for large batches") from None
            else:
                if response.status_code == 200:
                    return _json(response)
                error = ServiceError(response.status_code, _message(response))
                if response.status_code not in _RETRIED:
                    raise error
                wait_s = _retry_after(response)
            pause = wait_s if wait_s is not None else min(8.0, 0.25 * 2 ** attempt) * (0.5 + random.random() / 2)
            if time.monotonic() + pause > deadline:
                raise error
            time.sleep(pause)
            attempt += 1

    def _answer(self, data: Any) -> Answer:
        try:
            return Answer.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(200, f"{self.url}: an answer this kbv cannot read ({type(exc).__name__}: {exc}); "
                                    "is the service another kbv version?") from None


def _item(item: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, Sequence) and not isinstance(item, str) and len(item) in (2, 3):
        return dict(zip(("problem", "code", "protocol"), item))
    raise UsageError(f"evaluate_batch: an item is a mapping or (problem, code[, protocol]), not {type(item).__name__}")


def _json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ServiceError(response.status_code, f"not JSON: {response.text[:200]!r}") from None


def _message(response: Any) -> str:
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return f"HTTP {response.status_code}: {response.text[:200]}"


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
