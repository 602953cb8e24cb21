"""The request context: an id per request, one log line and the request metrics per answer.

`RequestContext` does it for every request that reaches the app; `service.http.edge` answers the
sheds decided from the head without the app, and uses the same pieces (`request_id`, `record`),
so a shed looks the same in the log and the metrics either way.
"""

from __future__ import annotations

import random
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics
from service.errors import ServiceError
from service.log import event_line
from service.protocols.routes import ROUTES, envelope_of
from service.protocols.serving import json_response

log = structlog.get_logger("service.app")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_ROUTE_LABELS = {route.path for route in ROUTES}
_UNLOGGED = frozenset({"/readyz", "/livez", "/metrics"})  # probes: counted, not logged


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's `X-Request-ID` if it is sane (1-128 of `A-Za-z0-9._:-`), else a new one
    (32 hex digits: 128 random bits from the process's Mersenne Twister, reseeded in each
    forked worker; an id must be unique, not secret, and `os.urandom`'s system call, which
    releases the GIL to the inference thread, cost the loop more than the rest of this)."""
    for name, value in headers:
        if name == b"x-request-id":
            sent = value.decode("latin-1")
            if _SANE_ID.match(sent):
                return sent
            break
    return f"{random.getrandbits(128):032x}"


_MAX_ERROR_CHARS = 160  # a request line with its reason stays under 300 characters
Reason = tuple[str, str]  # an error answer's (error_type, message), for its log line


@dataclass
class _Answer:
    """What the request context learns of its request's answer: why it is an error."""

    reason: Reason | None = None


#: The answer of the request being handled (set by `RequestContext`; a holder, so that what
#: a handler notes reaches the context whatever task it ran in).
_answer: ContextVar[_Answer | None] = ContextVar("answer", default=None)


def reason_of(error: ServiceError) -> Reason:
    """`error`'s type and message (cut at `_MAX_ERROR_CHARS`), for a request's log line."""
    message = error.message
    if len(message) > _MAX_ERROR_CHARS:
        message = message[: _MAX_ERROR_CHARS - 3] + "..."
    return error.error_type, message


def note_error(error: ServiceError) -> None:
    """The request being handled is answered with `error`: its `request` line says why."""
    holder = _answer.get()
    if holder is not None:
        holder.reason = reason_of(error)


def record(
    scope: Scope, request_id: str, status: int, seconds: float, reason: Reason | None = None
) -> None:
    """The request metrics (route, status; seconds) and, except for probes, one `request` log
    line; an error answer's line carries its `error_type` and `error` (`reason`)."""
    path = scope["path"]
    route = path if path in _ROUTE_LABELS else "other"
    requests, duration = metrics.request_metrics(route, status)
    requests.inc()
    duration.observe(seconds)
    if route in _UNLOGGED:
        return  # probes every few seconds would drown the log; the metrics count them
    fields = {
        "request_id": request_id,
        "method": scope["method"],
        "route": route,
        "status": status,
        "latency_ms": round(1000 * seconds, 2),
        "inputs": scope.get("state", {}).get("inputs", 0),
    }
    if reason is not None and status >= 400:
        fields["error_type"], fields["error"] = reason
    event_line("service.app", "request", fields)


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
        rid = request_id(scope["headers"])
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        state.setdefault("arrived", time.monotonic())  # a request held at the edge: its head
        status, started_response = 500, False
        answer = _Answer()
        token = _answer.set(answer)

        async def send_with_id(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status, started_response = message["status"], True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # a bug: log it in full, tell the client nothing internal
            log.error("unhandled_error", request_id=rid, exc_info=exc)
            if not started_response:
                await self._internal_error(scope["path"], rid, send_with_id)
        finally:
            _answer.reset(token)
            record(scope, rid, status, time.perf_counter() - started, answer.reason)

    @staticmethod
    async def _internal_error(path: str, request_id: str, send: Send) -> None:
        error = ServiceError("internal error; see the server log")  # status 500, internal_error
        response = json_response(envelope_of(path).content(error, request_id), 500)
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
