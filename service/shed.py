"""Shedding from the request head: the cheapest answer a request can get, and a tarpit for
clients that retry before their Retry-After.

A pure ASGI middleware in front of the router. For a `POST` to a route that submits model
work it decides from the head alone (no body read, no JSON parsed, no route or exception
machinery): while the server drains, loads, has a full queue, or predicts a wait past the
request's deadline, the request is answered 503 with `Retry-After` at once. What passes is
admitted again, exactly, when its inputs are counted (`WorkQueue.offer`).

Clients that ignore Retry-After and resend at once (a retry storm) would otherwise turn every
freed CPU cycle into another shed (Bronson et al., "Metastable Failures in Distributed
Systems", HotOS 2021): a connection shed once, that asks again before its Retry-After has
passed, is held (an idle timer, no CPU) until then, and its request is then admitted if there
is room, else shed. A retry is the same request again: the same connection (client address and
port), route and body length (`Content-Length`); what a storm client resends is byte for byte
what was shed. A first shed, every polite retry, and any other request (another route or body
length: behind a proxy that pools its upstream connections, the next client's request) is
answered at once. `SHED_TARPIT=false` turns the hold off.
"""

from __future__ import annotations

import asyncio
import hmac
import time

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from service import metrics
from service.errors import Overloaded, Unavailable, error_content
from service.runtime import Runtime, arrival

# Connections shed lately are remembered until their Retry-After passes; the expired ones are
# dropped at most this often, so the map holds about the connections of the last seconds.
_PURGE_EVERY_S = 5.0


class ShedGate:
    """Sheds `POST` requests to `paths` from their head (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, runtime: Runtime, paths: frozenset[str]) -> None:
        self.app = app
        self.runtime = runtime
        self.paths = paths
        self.tarpit = runtime.settings.shed_tarpit
        self._key = runtime.settings.api_key
        # (client (host, port), path, Content-Length) of a shed -> when its Retry-After passes
        self._retry_at: dict[tuple[object, str, bytes | None], float] = {}
        self._purge_at = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self._key is not None and not self._authorized(headers):
            await self.app(scope, receive, send)  # the route answers 401
            return
        asked = headers.get(b"x-request-timeout")
        refusal = self.runtime.refusal(scope, asked)
        if refusal is not None and self.tarpit and isinstance(refusal, Overloaded):
            left = arrival(scope) + (self.runtime.timeout(asked) or 0.0) - time.monotonic()
            hold = min(self._early_by(_request_key(scope, headers)), left)
            if hold > 0:  # a retry before its Retry-After: wait (no CPU), then decide again
                await asyncio.sleep(hold)
                refusal = self.runtime.refusal(scope, asked)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await self._answer(scope, send, refusal, _request_key(scope, headers))

    def _early_by(self, key: tuple[object, str, bytes | None]) -> float:
        """Seconds until the Retry-After of this request's last shed has passed (0: not early,
        or not shed before)."""
        retry_at = self._retry_at.get(key)
        return 0.0 if retry_at is None else max(0.0, retry_at - time.monotonic())

    async def _answer(
        self, scope: Scope, send: Send, error: Unavailable, key: tuple[object, str, bytes | None]
    ) -> None:
        metrics.count_shed(error)
        retry_after = error.headers["Retry-After"]
        if self.tarpit and isinstance(error, Overloaded):
            self._remember(key, float(retry_after))
        body = orjson.dumps(error_content(scope["path"], error, scope["state"]["request_id"]))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", retry_after.encode()),
        ]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _remember(self, key: tuple[object, str, bytes | None], retry_after_s: float) -> None:
        if key[0] is None:
            return
        now = time.monotonic()
        if now >= self._purge_at:  # forget the connections whose Retry-After has passed
            self._retry_at = {c: t for c, t in self._retry_at.items() if t > now}
            self._purge_at = now + _PURGE_EVERY_S
        self._retry_at[key] = now + retry_after_s

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        assert self._key is not None
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), self._key.encode()
        )


def _request_key(scope: Scope, headers: dict[bytes, bytes]) -> tuple[object, str, bytes | None]:
    """What makes a request a retry of one shed before: its connection, route, body length."""
    return scope.get("client"), scope["path"], headers.get(b"content-length")
