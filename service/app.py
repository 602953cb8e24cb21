"""create_app(): routes, the request-context middleware, the one error table, the lifespan."""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics
from service.batcher import Batcher
from service.errors import MethodNotAllowed, NotFound, ServiceError, error_content
from service.loading import load_engine
from service.log import configure_logging, event_line
from service.protocols.serving import json_response
from service.routes import INFERENCE_PATHS, ROUTES
from service.runtime import Runtime
from service.settings import Settings, load_settings
from service.shed import ShedGate

log = structlog.get_logger("service.app")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_ROUTE_LABELS = {route.path for route in ROUTES}


class RequestContext:
    """Pure ASGI middleware: request id (echoed if sane, else new), one log line and the
    request metrics per request, `X-Request-ID` on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"").decode("latin-1")
        request_id = sent if _SANE_ID.match(sent) else os.urandom(16).hex()
        state = scope.setdefault("state", {})
        state["request_id"], state["arrived"] = request_id, time.monotonic()
        status, started_response = 500, False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status, started_response = message["status"], True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # a bug: log it in full, tell the client nothing internal
            log.error("unhandled_error", request_id=request_id, exc_info=exc)
            if not started_response:
                await self._internal_error(scope["path"], request_id, send_with_id)
        finally:
            self._record(scope, request_id, status, time.perf_counter() - started)

    @staticmethod
    async def _internal_error(path: str, request_id: str, send: Send) -> None:
        error = ServiceError("internal error; see the server log")  # status 500, internal_error
        response = json_response(error_content(path, error, request_id), 500)
        await response({"type": "http"}, _no_receive, send)

    @staticmethod
    def _record(scope: Scope, request_id: str, status: int, seconds: float) -> None:
        path = scope["path"]
        route = path if path in _ROUTE_LABELS else "other"
        requests, duration = metrics.request_metrics(route, status)
        requests.inc()
        duration.observe(seconds)
        if route in ("/readyz", "/livez", "/metrics"):
            return  # probes every few seconds would drown the log; the metrics count them
        fields = {
            "request_id": request_id,
            "method": scope["method"],
            "route": route,
            "status": status,
            "latency_ms": round(1000 * seconds, 2),
            "inputs": scope["state"].get("inputs", 0),
        }
        event_line("service.app", "request", fields)


def _error_body(request: Request, exc: ServiceError) -> Response:
    request_id = request.scope.get("state", {}).get("request_id", "")
    content = error_content(request.scope["path"], exc, request_id)
    return json_response(content, exc.status, exc.headers)


async def _on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    metrics.count_shed(exc)
    return _error_body(request, exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = dict(exc.headers or {})
        error = MethodNotAllowed(f"{request.method} is not allowed here", headers=allowed)
        return _error_body(request, error)
    return _error_body(request, NotFound(f"no route {request.url.path}"))


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings | None = None, engine_factory: Any = load_engine) -> Starlette:
    """The ASGI app. `settings` default: read from the environment (exits on a bad value
    through the CLI); `engine_factory(settings) -> Engine` is replaceable for tests."""
    settings = settings or load_settings()
    configure_logging(settings.log_level, settings.log_format)
    runtime = Runtime(settings, Batcher(settings, engine_factory))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()
        yield
        await runtime.stop()

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={
            ServiceError: _on_service_error,
            HTTPException: _on_http_error,
        },
    )
    # No 307 from /readyz/ to /readyz: the redirect echoes the client's Host header.
    app.router.redirect_slashes = False
    # Inner first: sheds from the head come before routing, inside the request context (ids,
    # the log line and the request metrics are the same for every answer).
    app.add_middleware(ShedGate, runtime=runtime, paths=INFERENCE_PATHS)
    app.add_middleware(RequestContext)
    app.state.runtime = runtime
    return app
