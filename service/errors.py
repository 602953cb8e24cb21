"""Error types with data (status, error_type, headers), and the one place that maps them to HTTP.

Every error body is `{"error": ..., "error_type": ..., "request_id": ...}` (docs/api.md, Errors),
except where a route's dialect has its own (`Envelope`: OpenAI's, Cohere's); each route names
its envelope (`service.protocols.routes.envelope_of`).
Messages are for humans and never hold paths, exception text from the model, or stack traces.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, ClassVar


class ServiceError(Exception):
    """Base error: `status` and `error_type` per subclass; `message` is safe to show a client."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(
        self, message: str, *, headers: dict[str, str] | None = None, at: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        # Where inside the failing input's path the problem is (`[3]`: its fourth item), so
        # that the runtime names it as `input[3]`.
        self.at = at


class BadRequest(ServiceError):
    status, error_type = 400, "bad_request"


class Unauthorized(ServiceError):
    status, error_type = 401, "unauthorized"


class NotFound(ServiceError):
    status, error_type = 404, "not_found"


class MethodNotAllowed(ServiceError):
    status, error_type = 405, "method_not_allowed"


class PayloadTooLarge(ServiceError):
    status, error_type = 413, "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status, error_type = 415, "unsupported_media_type"


class InvalidInput(ServiceError):
    """422: the body parsed, but an input or parameter is invalid."""

    status, error_type = 422, "invalid_input"


class WrongTask(ServiceError):
    """424: the route needs a model of another task (TEI's status for the same case)."""

    status, error_type = 424, "wrong_task"


class Unavailable(ServiceError):
    """503 with `Retry-After` (whole seconds, at least 1). `shed`: the reason it counts under
    in `pipeline_server_shed_total` when it refuses a request at admission (None: not a shed,
    e.g. work that was admitted and could not finish before the drain ended)."""

    status, error_type = 503, "unavailable"

    def __init__(self, message: str, *, retry_after_s: float, shed: str | None = None) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})
        self.shed = shed


class Overloaded(Unavailable):
    """503: shed at admission (queue full, or the predicted wait exceeds the deadline)."""

    error_type = "overloaded"


class NotReady(Unavailable):
    error_type = "not_ready"


class Draining(Unavailable):
    error_type = "draining"


class DeadlineExceeded(ServiceError):
    status, error_type = 504, "deadline_exceeded"


class InferenceFailed(ServiceError):
    """500: the model failed on this input. Details go to the log, not the client."""

    status, error_type = 500, "inference_failed"


class Envelope(StrEnum):
    """The shape of an error body: ours, or a dialect's own."""

    #: `{"error", "error_type", "request_id"}`.
    SERVICE = "service"
    #: `{"error": {"message", "type", "param", "code"}}`: the openai SDK reads `error.message`;
    #: `code` is the HTTP status, as vLLM and TEI answer (vLLM's `/v1/rerank` too); the request
    #: id stays in `X-Request-ID`.
    OPENAI = "openai"
    #: `{"id", "message"}`: what the cohere SDK reads.
    COHERE = "cohere"

    def content(self, error: ServiceError, request_id: str) -> dict[str, Any]:
        """The body of `error` in this envelope."""
        if self is Envelope.COHERE:
            return {"id": request_id, "message": error.message}
        if self is Envelope.OPENAI:
            return {
                "error": {
                    "message": error.message,
                    "type": error.error_type,
                    "param": None,
                    "code": error.status,
                }
            }
        return {"error": error.message, "error_type": error.error_type, "request_id": request_id}
