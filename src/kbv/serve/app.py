"""The HTTP front of `kbv serve`, on FastAPI: three endpoints, the token, and errors as JSON.

    GET  /healthz             200 {"status": "ok", "device", "problems", "queue": {"depth", "max"},
                                   "pairs_evaluated", "answers", "cached_answers", "reward", "limits", ...}
    POST /v1/evaluate         200 one answer (`kbv.answer`)
    POST /v1/evaluate_batch   200 {"items": [one answer per item, in order]}

Every error is `{"error": "<one line>"}` with its status: 400 malformed JSON or a missing field; 401 a
missing or wrong `Authorization: Bearer <token>` (where the service has a token; /healthz needs
none, so that a liveness probe carries no secret); 404 an unknown problem or path; 405 a wrong
method; 413 a body, a batch or a code over its limit; 429 the queue is full (Retry-After: 1); 500 the
problem's own code, or kbv, failed on this request (the server goes on); 503 the service is stopping.
A batch is answered whole or refused whole; what finished before a refusal is stored all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from kbv.errors import ServiceError, first_line
from kbv.serve.requests import parse_batch, parse_evaluate
from kbv.serve.service import Service

T = TypeVar("T")
log = logging.getLogger("kbv.serve")


def create_app(service: Service, token: str | None) -> FastAPI:
    """The ASGI app serving `service`; `token` (None: none) guards /v1/*."""
    app = FastAPI(title="kbv serve", docs_url=None, redoc_url=None, openapi_url=None)
    limits = service.limits

    def error(exc: ServiceError) -> JSONResponse:
        status = exc.status or 500
        headers = {"Retry-After": "1"} if status == 429 else {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)

    async def guarded(request: Request, handle: Callable[[], Awaitable[Any]]) -> JSONResponse:
        """`handle()` as a 200, or its refusal as JSON; a bug in kbv is a 500, never a dead server."""
        try:
            _authorize(request, token)
            return JSONResponse(await handle())
        except ServiceError as exc:
            return error(exc)
        except Exception as exc:
            log.exception("kbv failed on %s %s", request.method, request.url.path)
            return error(ServiceError(500, f"kbv failed (a bug in kbv, not in the request): "
                                           f"{type(exc).__name__}: {first_line(exc)}"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:  # unknown path, wrong method
        what = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse({"error": f"{what}: {request.method} {request.url.path}"}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(service.health())

    @app.post("/v1/evaluate")
    async def evaluate(request: Request) -> JSONResponse:
        async def handle() -> Any:
            item = parse_evaluate(await _body(request, limits.max_body_bytes), limits)
            [future] = await run_in_threadpool(service.submit, [item])
            return (await _wait(future)).to_dict()

        return await guarded(request, handle)

    @app.post("/v1/evaluate_batch")
    async def evaluate_batch(request: Request) -> JSONResponse:
        async def handle() -> Any:
            items = parse_batch(await _body(request, limits.max_body_bytes), limits)
            futures = await run_in_threadpool(service.submit, items)
            return {"items": [(await _wait(future)).to_dict() for future in futures]}

        return await guarded(request, handle)

    return app


def _authorize(request: Request, token: str | None) -> None:
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ServiceError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):  # in constant time
        raise ServiceError(401, "wrong bearer token")


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ServiceError(413, f"the request body is {declared} bytes, over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServiceError(413, f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait(future: Future[T]) -> T:
    """The result of a thread's `future`, awaited without ever cancelling it: one evaluation may be
    awaited by many requests, and a client that leaves must not cancel it for the others."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def copy(done: Future[T]) -> None:
        if waiter.done():
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def hand_over(done: Future[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(copy, done)

    future.add_done_callback(hand_over)
    return await waiter
