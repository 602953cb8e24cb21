"""The admission policy: one object per server that admits, holds and sheds (503 with a reason
and `Retry-After`) the requests for model work before any work, and charges what sheds cost.

A `POST` to a route that submits model work is decided from its head alone (no body read, no
JSON parsed): while the server drains, loads, has a full queue, or predicts a wait past the
request's deadline (`WorkQueue.refusal`), it is answered 503 at once. What passes is decided
again, exactly, when its inputs are counted (`WorkQueue.offer`; its `Overloaded` reaches the
app's error table, which reports it here: `answered`).

Who calls what
- The HTTP edge (`service.http.edge`), when a head has ended and before any ASGI task exists:
  `hold`, then `decide`; a shed it writes itself is made by `shed` and charged by `charge_edge`;
  a `POST` it hands to the app runs `tracked`, so that a 503 the app answers is charged to the
  connection it came on (`Caller`) and an admission made at the head is not made twice.
- The app: `service.http.gate.AdmissionGate` calls `admit_head` for what the edge left to it
  (a request through a proxy, a pipelined one, an early retry, any request without the edge)
  and `shed`; the error table (`service.app`) calls `answered` for every error it answers.

Holds
- The tarpit (`service.admission.tarpit`, `SHED_TARPIT`): a retry sent before its Retry-After
  that would be shed waits (an idle timer, no CPU) until then, and is decided again. A first
  shed, a polite retry and any other request are answered at once.
- The shed budget (`service.admission.budget`, `SHED_BUDGET_SHARE`): while sheds have spent
  their share of the loop's CPU, a connection that did not wait for its last Retry-After is not
  read (`hold`) until the queue has room for its request or its hold ends.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal, TypeVarTuple

import orjson
from starlette.types import Scope

from service import metrics
from service.admission.api_key import authorized
from service.admission.budget import ShedBudget, longest_hold
from service.admission.tarpit import Tarpit, request_key
from service.errors import Envelope, Overloaded, ServiceError, Unavailable
from service.runtime.runtime import Runtime, arrival

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body
Outcome = Literal["admitted", "shed", "gone"]  # how a hold ended (`shed_held_total`)
Ts = TypeVarTuple("Ts")
_APP_RETRY_AFTER_S = 1.0  # after a 503 from the app: the least Retry-After a shed carries


class Head(Enum):
    """What the edge does with a request the head did not shed (`AdmissionPolicy.decide`)."""

    ADMITTED = "admitted"  # admitted from its head: the app's gate lets it through
    APP = "app"  # the app's gate decides it (not a request the edge decides)


@dataclass(slots=True)
class Caller:
    """What admission remembers of one connection; the edge keeps one per connection."""

    retry_at: float = 0.0  # monotonic: when the Retry-After of its last shed passes
    held_shed: int = 0  # its held requests that ended shed, one after another


@dataclass(slots=True)
class _Ticket:
    """A `POST` the edge handed to the app, while the app runs it."""

    caller: Caller
    admitted: bool  # admitted from its head: not decided again
    cpu_at: float = 0.0  # the loop thread's CPU clock as the app began (what a 503 costs)


_TICKET = "service.admission"  # the scope extension of a request the edge handed over


def _ticket(scope: Scope) -> _Ticket | None:
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(_TICKET)


class AdmissionPolicy:
    """Admission for the routes in `envelopes` (`POST`s that submit model work, each with the
    envelope of its error bodies); `runtime` gives readiness, the deadline, the queue and its
    cost model. The loop's thread only."""

    def __init__(self, runtime: Runtime, envelopes: Mapping[str, Envelope]) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.envelopes = envelopes
        self._tarpit = Tarpit() if self.settings.shed_tarpit else None
        share = self.settings.shed_budget_share
        self.budget = ShedBudget(share, self._room) if share > 0 else None

    # -- the rule ----------------------------------------------------------------------
    def admit(self, inputs: int, deadline: float) -> Overloaded | None:
        """Why `inputs` more inputs due by `deadline` (monotonic s) must be shed now (the queue
        is full, or their predicted wait passes the deadline: `WorkQueue.refusal`), or None.
        Read without the queue's lock: a stale read decides one request a batch late, and
        `WorkQueue.offer` decides again."""
        return self.runtime.inference.refusal(inputs, deadline)

    def _refusal(self, scope: Scope, asked_timeout: bytes | None) -> Unavailable | None:
        """Why a request for model work must be answered 503 from its head alone (draining,
        not ready, or no room for one input by its deadline), or None; None too for a bad
        `X-Request-Timeout` (its route answers 400)."""
        try:
            self.runtime.model_info()
        except Unavailable as exc:
            return exc
        timeout = self.runtime.timeout(asked_timeout)
        if timeout is None:
            return None
        return self.admit(1, arrival(scope) + timeout)

    def _sheddable(self, scope: Scope) -> dict[bytes, bytes] | None:
        """The headers of a request this policy may shed from its head: a `POST` to one of
        `paths`, authorized when an API key is set; None for any other (the app answers it:
        an unauthorized one gets its route's 401)."""
        if scope["method"] != "POST" or scope["path"] not in self.envelopes:
            return None
        if not authorized(scope["headers"], self.settings.api_key):
            return None
        return dict(scope["headers"])

    # -- at the edge -------------------------------------------------------------------
    def decide(self, scope: Scope) -> Unavailable | Head:
        """For the edge, when a request's head has ended: the error to shed it with now, or
        `Head.ADMITTED`, or `Head.APP` when the app must decide: not a sheddable `POST`,
        carrying `X-Forwarded-For` (the tarpit keys on the client that uvicorn's proxy-headers
        middleware sets), or an early retry (the app's gate holds it)."""
        headers = self._sheddable(scope)
        if headers is None or b"x-forwarded-for" in headers:
            return Head.APP
        refusal = self._refusal(scope, headers.get(b"x-request-timeout"))
        if refusal is None:
            return Head.ADMITTED
        if self._early(scope, refusal) > 0:
            return Head.APP
        return refusal

    def hold(
        self, scope: Scope, caller: Caller, release: Callable[[*Ts], None], *args: *Ts
    ) -> bool:
        """Hold the request (True: the edge stops reading its connection until
        `release(*args)`, as `loop.call_later` calls back) when the shed budget is spent,
        `caller`'s last shed asked it to wait longer, and the request is one the head may shed;
        it is decided again when released. Its deadline runs from now (its arrival is set in
        the scope's state)."""
        budget = self.budget
        if budget is None:
            return False
        now = time.monotonic()
        if now >= caller.retry_at:
            caller.held_shed = 0  # a first request or a polite one: a hold starts short again
            return False
        if not budget.exhausted():
            return False  # sheds within their share
        scope["state"]["arrived"] = now
        deadline = self._deadline(scope)
        if deadline is None:
            return False
        budget.hold(functools.partial(release, *args), deadline, longest_hold(caller.held_shed))
        return True

    def released(self, caller: Caller, outcome: Outcome) -> None:
        """A held request was released and ended `outcome` (`gone`: its client left)."""
        metrics.SHED_HELD.labels(outcome).inc()
        if outcome != "gone":
            caller.held_shed = caller.held_shed + 1 if outcome == "shed" else 0

    def charge_edge(self, caller: Caller, error: Unavailable, cpu_since: float) -> None:
        """After a shed the edge wrote: `caller` did not wait if it asks again before the
        shed's Retry-After; the budget is charged the loop CPU since `cpu_since`
        (`time.thread_time`, when the read that brought the head began)."""
        caller.retry_at = time.monotonic() + float(error.headers["Retry-After"])
        if self.budget is not None:
            self.budget.charge(time.thread_time() - cpu_since)

    def track(self, scope: Scope, caller: Caller, *, admitted: bool) -> None:
        """For one `POST` the edge hands over on `caller`'s connection (a ticket in its
        scope's extensions, which end with it): a 503 the app answers for it (`answered`,
        `shed`) is charged from when the app began (`admit_head`) and asks `caller` to wait;
        `admitted` (`Head.ADMITTED`): the app's gate lets it through."""
        scope.setdefault("extensions", {})[_TICKET] = _Ticket(caller, admitted)

    # -- in the app --------------------------------------------------------------------
    async def admit_head(self, scope: Scope) -> Unavailable | None:
        """For the app's gate: the error to shed a request with from its head, or None to
        let it through. A retry sent before its Retry-After that would be shed is first held
        until then (at most to its deadline: an idle timer, no CPU) and decided again."""
        ticket = _ticket(scope)
        if ticket is not None:
            ticket.cpu_at = time.thread_time()  # the app begins
            if ticket.admitted:
                return None  # the edge admitted it from the same head
        headers = self._sheddable(scope)
        if headers is None:
            return None
        asked = headers.get(b"x-request-timeout")
        refusal = self._refusal(scope, asked)
        if refusal is None:
            return None
        left = arrival(scope) + (self.runtime.timeout(asked) or 0.0) - time.monotonic()
        hold = min(self._early(scope, refusal), left)
        if hold > 0:
            await asyncio.sleep(hold)
            if ticket is not None:
                ticket.cpu_at = time.thread_time()  # the wait cost the loop nothing
            refusal = self._refusal(scope, asked)
        return refusal

    def answered(self, scope: Scope, error: ServiceError) -> None:
        """The app answered `error` (its error table): a shed is counted under its reason, and
        a 503 to a `POST` is charged to the connection it came on (`track`). A `GET`'s 503
        (`/readyz` while loading or draining) is a probe's answer, not a shed."""
        metrics.count_shed(error)
        if error.status == 503:
            self._charge_app(scope)

    def _charge_app(self, scope: Scope) -> None:
        ticket = _ticket(scope)
        if ticket is None or scope["method"] != "POST":
            return
        ticket.caller.retry_at = time.monotonic() + _APP_RETRY_AFTER_S
        if self.budget is not None:
            self.budget.charge(time.thread_time() - ticket.cpu_at)

    # -- a shed's answer ---------------------------------------------------------------
    def shed(self, scope: Scope, error: Unavailable, request_id: str, *, in_app: bool) -> Answer:
        """Count the shed, remember it for the tarpit, and make its answer (the service's
        error body, `Retry-After`); `in_app`: answered by the app's gate (charged as the app's
        503s are), else by the edge (`charge_edge` once written)."""
        metrics.count_shed(error)
        if self._tarpit is not None and isinstance(error, Overloaded):
            self._tarpit.remember(request_key(scope), float(error.headers["Retry-After"]))
        answer = _answer(self.envelopes[scope["path"]], error, request_id)
        if in_app:
            self._charge_app(scope)
        return answer

    # -- helpers -----------------------------------------------------------------------
    def _early(self, scope: Scope, refusal: Unavailable) -> float:
        """Seconds the tarpit holds a request that `refusal` would shed (0: answer now)."""
        if self._tarpit is None or not isinstance(refusal, Overloaded):
            return 0.0
        return self._tarpit.early_by(request_key(scope))

    def _deadline(self, scope: Scope) -> float | None:
        """The deadline (monotonic s) of a request the head may shed (not through a proxy),
        else None; None too while draining, so a request on an open connection after SIGTERM
        is answered 503 at once (DESIGN: Shutdown) instead of held past the process's exit."""
        if self.runtime.draining:
            return None
        headers = self._sheddable(scope)
        if headers is None or b"x-forwarded-for" in headers:
            return None
        timeout = self.runtime.timeout(headers.get(b"x-request-timeout"))
        return arrival(scope) + (timeout or self.settings.request_timeout_s)

    def _room(self, deadline: float) -> int:
        """For the shed budget: how many held requests may go now, the oldest due by
        `deadline` (the queue's room for them, none while their deadline could not be met;
        all while draining, to be answered at once; none until the model is ready)."""
        if self.runtime.draining:
            return 1 << 30
        try:
            self.runtime.model_info()
        except Unavailable:
            return 0
        return self.runtime.inference.room_by(deadline)


def _answer(envelope: Envelope, error: Unavailable, request_id: str) -> Answer:
    """A shed's answer: its route's error body and `Retry-After`."""
    body = orjson.dumps(envelope.content(error, request_id))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", error.headers["Retry-After"].encode()),
    ]
    return error.status, headers, body
