"""Reading a request body under MAX_BODY_BYTES (413 as soon as it is over)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Scope

from service.errors import BadRequest, PayloadTooLarge

# A body refused before it was read whole: close the connection after the answer, so the rest
# of it is never read (keeping the connection would mean reading what was refused).
_CLOSE = {"Connection": "close"}


def header(scope: Scope, name: bytes) -> str | None:
    """The request's first `name` header (lower case, as ASGI gives them), or None: one pass
    over the scope's list, where starlette's `Headers.get` raises and catches a KeyError for
    each header a request lacks (most lack X-Request-Timeout)."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it exceeds `limit` bytes: by Content-Length
    before reading, or while it streams in (chunked bodies have no Content-Length)."""
    declared = header(request.scope, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(
                f"body is {declared} bytes; the limit is {limit} (MAX_BODY_BYTES)",
                headers=_CLOSE,
            )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)", headers=_CLOSE
            )
        chunks.append(chunk)
    return b"".join(chunks)
