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

Under uvicorn with the service's HTTP edge a shed is cheaper still: the gate leaves itself in
the lifespan state (`service.http.edge.HEAD_SHEDDER`), and the edge asks it (`shed_now`) when a
request's head ends, before any ASGI task, middleware or message exists; a shed is then written
straight to the connection, with the same status, headers, body, metrics and log line. What
the edge does not shed (an early retry to hold, a request through a proxy, a pipelined one)
takes the ASGI path here.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from service import metrics
from service.admission.api_key import authorized
from service.admission.budget import CPU_AT, ShedBudget
from service.errors import Overloaded, Unavailable, error_content
from service.http import context
from service.http.edge import HEAD_SHEDDER, Answer
from service.runtime.runtime import Runtime, arrival

# Connections shed lately are remembered until their Retry-After passes; the expired ones are
# dropped at most this often, so the map holds about the connections of the last seconds.
_PURGE_EVERY_S = 5.0

Key = tuple[object, str, bytes | None]  # (client (host, port), path, Content-Length)
# set in a request's state by `shed_now`: no shed from its head
_PASSED = "service.http.shed_gate.passed"


class ShedGate:
    """Sheds `POST` requests to `paths` from their head (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, runtime: Runtime, paths: frozenset[str]) -> None:
        self.app = app
        self.runtime = runtime
        self.paths = paths
        self.tarpit = runtime.settings.shed_tarpit
        self._key = runtime.settings.api_key
        # (client (host, port), path, Content-Length) of a shed -> when its Retry-After passes
        self._retry_at: dict[Key, float] = {}
        self._purge_at = 0.0
        share = runtime.settings.shed_budget_share
        # What sheds may cost the loop (issue 24); the edge charges and holds (service.http.edge).
        self.budget = ShedBudget(share, self._room) if share > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and "state" in scope:
            # For the edge (`shed_now`): uvicorn hands this state to each connection's protocol.
            scope["state"][HEAD_SHEDDER] = self
        if scope["type"] == "http":  # what a shed answered on the app's path costs the loop
            scope["state"][CPU_AT] = time.thread_time()
        if scope["type"] != "http" or scope["state"].pop(_PASSED, False):
            await self.app(scope, receive, send)  # (passed: the edge found no reason to shed)
            return
        headers = self._sheddable(scope)
        if headers is None:
            await self.app(scope, receive, send)
            return
        asked = headers.get(b"x-request-timeout")
        refusal = self.runtime.refusal(scope, asked)
        if refusal is not None and self.tarpit and isinstance(refusal, Overloaded):
            left = arrival(scope) + (self.runtime.timeout(asked) or 0.0) - time.monotonic()
            hold = min(self._early_by(_request_key(scope, headers)), left)
            if hold > 0:  # a retry before its Retry-After: wait (no CPU), then decide again
                await asyncio.sleep(hold)
                scope["state"][CPU_AT] = time.thread_time()  # the sleep cost the loop nothing
                refusal = self.runtime.refusal(scope, asked)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await self._answer(scope, send, refusal, _request_key(scope, headers))

    def shed_now(self, scope: Scope) -> Answer | None:
        """For the HTTP edge, when a request's head has ended and before any ASGI app runs:
        the whole answer of a shed (status, headers with `X-Request-ID`, body), its metrics and
        log line already recorded, as the ASGI path would give them; None when the request must
        go to the app: not a `POST` to an inference route, not shed, an early retry (the app
        holds it), unauthorized (the route answers 401), or carrying `X-Forwarded-For` (the
        client the tarpit keys on is then uvicorn's proxy-headers middleware's to set)."""
        started = time.perf_counter()
        headers = self._sheddable(scope)
        if headers is None or b"x-forwarded-for" in headers:
            return None
        refusal = self.runtime.refusal(scope, headers.get(b"x-request-timeout"))
        if refusal is None:
            scope["state"][_PASSED] = True  # the app's gate need not decide it again
            return None
        key = _request_key(scope, headers)
        if self.tarpit and isinstance(refusal, Overloaded) and self._early_by(key) > 0:
            return None
        request_id = context.request_id(scope["headers"])
        status, answer_headers, body = self._shed(scope["path"], refusal, key, request_id)
        answer_headers.append((b"x-request-id", request_id.encode()))
        context.record(scope, request_id, status, time.perf_counter() - started)
        return status, answer_headers, body

    def deadline(self, scope: Scope) -> float | None:
        """For the edge's shed budget: the deadline (monotonic s) of a request this gate may
        shed (a `POST` to an inference route, authorized, not through a proxy), else None; None
        too while draining, so a request on an open connection after SIGTERM is answered 503 at
        once (DESIGN: Shutdown) instead of held past the process's exit."""
        if self.runtime.draining:
            return None
        headers = self._sheddable(scope)
        if headers is None or b"x-forwarded-for" in headers:
            return None
        timeout = self.runtime.timeout(headers.get(b"x-request-timeout"))
        return arrival(scope) + (timeout or self.runtime.settings.request_timeout_s)

    def _room(self, deadline: float) -> int:
        """For the shed budget: how many held requests may go now, the oldest due by `deadline`
        (the queue's room for them, none while their deadline could not be met; all while
        draining, to be answered at once; none until the model is ready)."""
        if self.runtime.draining:
            return 1 << 30
        try:
            self.runtime.model_info()
        except Unavailable:
            return 0
        batcher = self.runtime.batcher
        return batcher.queue.room_by(deadline, batcher.estimate)

    def _sheddable(self, scope: Scope) -> dict[bytes, bytes] | None:
        """The headers of a request this gate may shed: a `POST` to an inference route,
        authorized when an API key is set. None for any other: the app answers it (an
        unauthorized one gets the route's 401)."""
        if scope["method"] != "POST" or scope["path"] not in self.paths:
            return None
        headers = dict(scope["headers"])
        if not authorized(scope["headers"], self._key):
            return None
        return headers

    def _early_by(self, key: Key) -> float:
        """Seconds until the Retry-After of this request's last shed has passed (0: not early,
        or not shed before)."""
        retry_at = self._retry_at.get(key)
        return 0.0 if retry_at is None else max(0.0, retry_at - time.monotonic())

    async def _answer(self, scope: Scope, send: Send, error: Unavailable, key: Key) -> None:
        request_id = scope["state"]["request_id"]
        status, headers, body = self._shed(scope["path"], error, key, request_id)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _shed(self, path: str, error: Unavailable, key: Key, request_id: str) -> Answer:
        """Count the shed, remember it for the tarpit, and make its answer."""
        metrics.count_shed(error)
        retry_after = error.headers["Retry-After"]
        if self.tarpit and isinstance(error, Overloaded):
            self._remember(key, float(retry_after))
        body = orjson.dumps(error_content(path, error, request_id))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", retry_after.encode()),
        ]
        return error.status, headers, body

    def _remember(self, key: Key, retry_after_s: float) -> None:
        if key[0] is None:
            return
        now = time.monotonic()
        if now >= self._purge_at:  # forget the connections whose Retry-After has passed
            self._retry_at = {c: t for c, t in self._retry_at.items() if t > now}
            self._purge_at = now + _PURGE_EVERY_S
        self._retry_at[key] = now + retry_after_s


def _request_key(scope: Scope, headers: dict[bytes, bytes]) -> Key:
    """What makes a request a retry of one shed before: its connection, route, body length."""
    return scope.get("client"), scope["path"], headers.get(b"content-length")
