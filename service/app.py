"""create_app(): the routes, the middleware (`service.http.context`, `service.http.gate`), the
one error table, the lifespan, and the admission policy the HTTP edge is bound to
(`Service.admission`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.admission.policy import AdmissionPolicy
from service.engine.face import Inference
from service.engine.loading.load import load_engine
from service.errors import MethodNotAllowed, NotFound, ServiceError
from service.http import context
from service.http.context import RequestContext
from service.http.direct import DirectRoutes, post_handlers
from service.http.gate import AdmissionGate
from service.log import configure_logging
from service.protocols.routes import INFERENCE_PATHS, ROUTES, envelope_of
from service.protocols.serving import json_response
from service.runtime.runtime import Runtime
from service.settings import Settings, process_settings


def _error_body(request: Request, exc: ServiceError) -> Response:
    context.note_error(exc)  # the request's log line says why
    request_id = request.scope.get("state", {}).get("request_id", "")
    content = envelope_of(request.scope["path"]).content(exc, request_id)
    return json_response(content, exc.status, exc.headers)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = dict(exc.headers or {})
        error = MethodNotAllowed(f"{request.method} is not allowed here", headers=allowed)
        return _error_body(request, error)
    return _error_body(request, NotFound(f"no route {request.url.path}"))


class Service(Starlette):
    """The ASGI app, with the runtime and the admission policy it was made with."""

    def __init__(self, runtime: Runtime, admission: AdmissionPolicy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runtime = runtime
        self.admission = admission


def create_app(settings: Settings | None = None, engine_factory: Any = load_engine) -> Service:
    """The ASGI app. `settings` default: read from the environment (exits on a bad value
    through the CLI); `engine_factory(settings) -> Engine` is replaceable for tests."""
    settings = settings or process_settings()
    configure_logging(settings.log_level, settings.log_format)
    runtime = Runtime(settings, Inference(settings, engine_factory))
    admission = AdmissionPolicy(runtime, {path: envelope_of(path) for path in INFERENCE_PATHS})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()
        yield
        await runtime.stop()

    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        admission.answered(request.scope, exc)  # counts a shed; charges a 503 to its connection
        return _error_body(request, exc)

    app = Service(
        runtime,
        admission,
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={
            ServiceError: on_service_error,
            HTTPException: _on_http_error,
        },
    )
    # No 307 from /readyz/ to /readyz: the redirect echoes the client's Host header.
    app.router.redirect_slashes = False
    # Inner first: the model routes' POSTs skip the router; sheds from the head come before
    # routing, inside the request context (ids, the log line and the request metrics are the
    # same for every answer).
    app.add_middleware(DirectRoutes, handlers=post_handlers(ROUTES), on_error=on_service_error)
    app.add_middleware(AdmissionGate, policy=admission)
    app.add_middleware(RequestContext)
    app.state.runtime = runtime
    return app
