"""Test helpers for kbv.generate: a real chat-completions server on loopback, tiny problems, replies.

`ChatServer` is an http.server.ThreadingHTTPServer on 127.0.0.1 (a free port) serving
POST /v1/chat/completions. Replies are scripted per model name:

    chat_server.on("flaky", Scripted(status=429, headers={"Retry-After": "0"}), "```python\\n...```")

The n-th request for a model gets the n-th item (the last one repeats). An item is a Scripted, a
content string, or a function of the request body returning either. Every request body is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union


@dataclass(frozen=True)
class Scripted:
    """One scripted HTTP answer."""

    content: str | None = ""
    status: int = 200
    delay_s: float = 0.0  # sleep before answering (a slow model, or one past the client's timeout)
    headers: dict[str, str] = field(default_factory=dict)
    usage: tuple[int, int] | None = (11, 7)  # (prompt_tokens, completion_tokens); None: not reported
    finish_reason: str = "stop"


Script = Union[Scripted, str, Callable[[dict[str, Any]], Union[Scripted, str]]]


class ChatServer:
    """The scripted endpoint; `url` is the base URL to give the client (…/v1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Script]] = {}
        self._counts: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.chat = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def on(self, model: str, *scripts: Script) -> None:
        with self._lock:
            self._scripts[model] = list(scripts)
            self._counts[model] = 0

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r.get("model") == model]

    def next_answer(self, body: dict[str, Any], headers: dict[str, str]) -> Scripted:
        model = str(body.get("model"))
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            scripts = self._scripts.get(model)
            if not scripts:
                return Scripted(status=404, content=f"The model '{model}' does not exist")
            n = self._counts[model]
            self._counts[model] = n + 1
            script = scripts[min(n, len(scripts) - 1)]
        if callable(script):
            script = script(body)
        return Scripted(content=script) if isinstance(script, str) else script

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        chat: ChatServer = self.server.chat  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}, {})
            return
        answer = chat.next_answer(body, {k.lower(): v for k, v in self.headers.items()})
        chat.enter()
        try:
            time.sleep(answer.delay_s)
            self._send(answer.status, _payload(body, answer), answer.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): what a real server sees too
        finally:
            chat.leave()

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def _payload(body: dict[str, Any], answer: Scripted) -> dict[str, Any]:
    if answer.status != 200:
        return {"error": {"message": answer.content or f"status {answer.status}", "type": "scripted", "code": None}}
    payload: dict[str, Any] = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.content},
                     "finish_reason": answer.finish_reason}],
    }
    if answer.usage is not None:
        p, c = answer.usage
        payload["usage"] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    return payload


# --- problems and replies

DOUBLE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2


batch_size = 4096  # kbv: smoke=8
dim = 1024  # kbv: smoke=4


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

ADD_BIAS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super(Model, self).__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x + self.bias


features = 16


def get_inputs():
    return [torch.randn(4, features)]


def get_init_inputs():
    return [features]
'''


def task_source(prompt: str) -> str:
    """The problem source a rendered prompt asks about (its last fenced block)."""
    from kbv.generate.extract import fenced_blocks

    return fenced_blocks(prompt)[-1].code


def honest_reply(body: dict[str, Any]) -> str:
    """A correct pure-PyTorch answer for whatever problem the prompt holds: its Model, renamed."""
    source = task_source(body["messages"][-1]["content"])
    return "Here is the optimized model.\n\n```python\n" + re.sub(r"\bModel\b", "ModelNew", source) + "```\n"
