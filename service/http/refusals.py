"""What the HTTP edge answers itself: the refusal type, its bytes on the wire, its count and
its log line (at most one per second per reason, so that a flood cannot flood the log)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import orjson
import structlog
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from service import metrics

log = structlog.get_logger("service.edge")

REASONS = ("head_too_large", "head_timeout", "connection_limit", "bad_request", "not_implemented")
_LOG_EVERY_S = 1.0
_last_logged: dict[str, float] = {}
_unlogged: Counter[str] = Counter()


class Refusal(Exception):
    """A request or connection the edge answers itself (`status`, `reason`: the metric's label
    and the body's `error_type`), then closes."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def answer(refusal: Refusal, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole HTTP/1.1 answer: the service's error body, `Connection: close`, an
    `X-Request-ID`, and `Retry-After: 1` on a 503."""
    request_id = uuid.uuid4().hex
    body = orjson.dumps(
        {"error": refusal.message, "error_type": refusal.reason, "request_id": request_id}
    )
    headers = [*default_headers, (b"content-type", b"application/json")]
    headers += [(b"content-length", b"%d" % len(body)), (b"connection", b"close")]
    headers.append((b"x-request-id", request_id.encode()))
    if refusal.status == 503:
        headers.append((b"retry-after", b"1"))
    lines = b"".join(b"%s: %s\r\n" % pair for pair in headers)
    return STATUS_LINE[refusal.status] + lines + b"\r\n" + body


def record(refusal: Refusal, client: Any) -> None:
    """Count the refusal; log it unless its reason was logged within the last second: the next
    line says how many were left out."""
    metrics.HTTP_REFUSED.labels(refusal.reason).inc()
    left_out = throttled(refusal.reason)
    if left_out is None:
        return
    log.warning(
        "http_refused",
        reason=refusal.reason,
        status=refusal.status,
        error=refusal.message,
        client=client[0] if client else None,
        unlogged_before=left_out,
    )


def throttled(key: str) -> int | None:
    """None when a line for `key` was logged within the last second (it is counted instead);
    else how many were left out since the last one, and the clock restarts."""
    now = time.monotonic()
    if now - _last_logged.get(key, float("-inf")) < _LOG_EVERY_S:
        _unlogged[key] += 1
        return None
    _last_logged[key] = now
    return _unlogged.pop(key, 0)


for _reason in REASONS:
    metrics.HTTP_REFUSED.labels(_reason)  # every reason is exported from the start, at 0
