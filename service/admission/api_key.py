"""The API key check, the one both the edge's head sheds and the routes use."""

from __future__ import annotations

import hmac
from collections.abc import Iterable


def authorized(headers: Iterable[tuple[bytes, bytes]], key: str | None) -> bool:
    """True when no key is set (`key` None) or the first `Authorization` header is
    `Bearer <key>` (the scheme in any case, the token trimmed of whitespace), compared in
    constant time. `headers`: the ASGI scope's (lower-case names, raw bytes)."""
    if key is None:
        return True
    value = next((v for k, v in headers if k == b"authorization"), b"")
    scheme, _, token = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())
