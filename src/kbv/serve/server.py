"""`serve(ServeConfig)`: bind, open the run, serve with uvicorn until a signal, then stop gracefully.

- It binds 127.0.0.1 unless told otherwise, and refuses any host beyond this machine without a
  token: the token is read from the environment variable `token_env` names, never from the command
  line (where `ps` shows it). The socket is bound before anything is loaded, so a port in use is one
  line at once; port 0 takes a free one, and the ready line says which.
- The run is one `kbv.api.open_session` for the service's life: one store, one executor, one secret.
- SIGTERM or SIGINT: the listening socket closes and idle connections with it (no new requests);
  the admitted pairs go on for up to `drain_timeout_s`, and their answers are sent; then whatever is
  still in flight is aborted (every child killed, those clients answered 503, nothing more stored),
  the executor closes and the store with it. A second signal aborts at once. Every verdict stored
  stays stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from kbv.api import EvalConfig, check_config, open_session
from kbv.errors import UsageError
from kbv.problems import load_problems
from kbv.reward_rules import DEFAULT_RULE, reward_rule
from kbv.serve.requests import Limits
from kbv.serve.service import Service

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class ServeConfig:
    """Everything `serve` needs. `evaluation` says what and where to evaluate as for `kbv eval`
    (its `candidates` and `protocol` are the service's own: requests bring the code and choose)."""

    evaluation: EvalConfig
    host: str = "127.0.0.1"
    port: int = 8000
    token_env: str | None = None  # the environment variable holding the bearer token
    reward: str = DEFAULT_RULE
    limits: Limits = field(default_factory=Limits)
    drain_timeout_s: float = 20.0  # after SIGTERM, how long admitted pairs may still take
    log_level: str = "warning"
    access_log: bool = False


@dataclass(frozen=True)
class ServeResult:
    url: str
    aborted: int  # pairs still in flight when the drain's bound ran out (none stored)


def serve(config: ServeConfig, ready: Callable[[str], None] | None = None) -> ServeResult:
    """Serve until SIGTERM or SIGINT; `ready(line)` once the service answers. Raises UsageError
    (and the loading errors) before anything is served."""
    _check(config)
    uvicorn = _require_extra()
    rule = reward_rule(config.reward)
    token = _token(config.token_env)
    _check_host(config.host, token)
    sock = _bind(config.host, config.port)
    url = _url(config.host, sock.getsockname()[1])
    evaluation = replace(config.evaluation, candidates="serve", protocol="both")
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.closing(sock))
        problems = load_problems(evaluation.problems)
        session = stack.enter_context(open_session(evaluation))
        about = {"kbv": _version(), "executor": evaluation.executor, "keep_problems": evaluation.keep_problems}
        service = Service(session, problems, rule, config.limits, about)
        from kbv.serve.app import create_app

        server = _server_class(uvicorn)(
            uvicorn.Config(create_app(service, token), lifespan="off", log_level=config.log_level,
                           access_log=config.access_log, timeout_graceful_shutdown=config.drain_timeout_s + 10),
            service, config.drain_timeout_s)
        line = (f"kbv serve: {url} · {len(problems)} problems · {session.settings.device} · "
                f"reward {rule.name} v{rule.version} · run {session.settings.run_dir} · "
                f"sandbox: {session.settings.provenance.get('sandbox', 'unknown')}")
        server.on_ready = (lambda: ready(line)) if ready else None
        _freeze_heap()
        server.run(sockets=[sock])
        aborted = server.aborted
    return ServeResult(url, aborted)


def _require_extra() -> Any:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise UsageError(f"kbv serve needs FastAPI and uvicorn ({exc.name} is missing): "
                         "pip install 'kernelbench-verified[serve]'") from None
    return uvicorn


def _check(config: ServeConfig) -> None:
    """Every option, before anything is bound or started (the evaluation's as `kbv eval` checks them)."""
    check_config(config.evaluation)
    limits = config.limits
    for name, value in (("--max-code-bytes", limits.max_code_bytes), ("--max-batch", limits.max_batch),
                        ("--max-queue", limits.max_queue), ("--max-body-bytes", limits.max_body_bytes)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1.")
    if not 0 <= config.drain_timeout_s < math.inf:
        raise UsageError(f"--drain-timeout {config.drain_timeout_s:g}: expected 0 or more seconds.")
    if not 0 <= config.port <= 65535:
        raise UsageError(f"--port {config.port}: expected 0-65535 (0 takes a free port).")
    if config.log_level not in LOG_LEVELS:
        raise UsageError(f"Unknown --log-level '{config.log_level}': expected {', '.join(LOG_LEVELS)}.")


def _token(variable: str | None) -> str | None:
    if variable is None:
        return None
    token = os.environ.get(variable, "").strip()
    if not token:
        raise UsageError(f"--token-env {variable}: that environment variable is not set or is empty.")
    return token


def is_local(host: str) -> bool:
    """Whether `host` names this machine's loopback alone (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_host(host: str, token: str | None) -> None:
    if token is None and not is_local(host):
        raise UsageError(f"--host {host} serves beyond this machine: give --token-env VAR, a variable that "
                         "holds a bearer token, or serve on 127.0.0.1.")


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port). Raises UsageError in one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: cannot resolve it: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)  # the children must not hold the service's port
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


def _freeze_heap() -> None:
    """Keep what start-up made (torch, the problems, the runners: millions of objects) out of the
    garbage collector's full passes, which otherwise stall every request in flight for a few hundred
    milliseconds now and then (seen: a cached answer's p99 at 340 ms under 16 clients)."""
    import gc

    gc.collect()
    gc.freeze()


def _version() -> str:
    from kbv import __version__

    return __version__


def _server_class(uvicorn: Any) -> type:
    """uvicorn's Server, stopping as this module's docstring says (uvicorn >= 0.30)."""

    class GracefulServer(uvicorn.Server):  # type: ignore[misc,name-defined]
        def __init__(self, config: Any, service: Service, drain_timeout_s: float) -> None:
            super().__init__(config)
            self.service = service
            self.drain_timeout_s = drain_timeout_s
            self.on_ready: Callable[[], None] | None = None
            self.aborted = 0
            self._abort_now = False

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and self.on_ready is not None:
                self.on_ready()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """SIGTERM and SIGINT start the graceful stop; a second one aborts at once. Unlike
            uvicorn's own, the signal is not raised again afterwards: the stop is the exit."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def _on_signal(self, signum: int, frame: Any) -> None:
            if self.should_exit:
                self._abort_now = True
            self.should_exit = True

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            self.service.drain()
            bound = asyncio.ensure_future(self._bound_drain())
            try:
                await super().shutdown(sockets)
            finally:
                bound.cancel()
            if self.service.in_flight:  # uvicorn's own bound cancelled the handlers first
                self.aborted += self.service.abort()

        async def _bound_drain(self) -> None:
            """Let the admitted pairs finish for `drain_timeout_s`, then abort what is left."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.drain_timeout_s
            while self.service.in_flight and loop.time() < deadline and not self._abort_now:
                await asyncio.sleep(0.05)
            if self.service.in_flight:
                self.aborted += self.service.abort()
                sys.stderr.write(f"kbv serve: aborted {self.aborted} pairs still in flight after "
                                 f"{self.drain_timeout_s:g} s (not stored; their clients got 503)\n")

    return GracefulServer
