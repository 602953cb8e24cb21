"""The HTTP edge: `service.http.bounded.BoundedProtocol` plus admission from the request head.

When a request's head ends, before an ASGI task, middleware or message exists, the edge asks
the server's admission policy (`service.admission.policy.AdmissionPolicy`) what to do with it:
- hold it (`hold`): the shed budget is spent and this connection did not wait for its last
  Retry-After; its connection is not read until the policy releases it, and it is then decided
  again;
- shed it (`decide` gives the error): the whole 503 is written here at once, with the same
  status, headers, body, metrics and log line as the app would give it, and charged
  (`charge_edge`);
- or hand it to the app (admitted from its head, or left to the app's gate: a request through
  a proxy, an early retry). A `POST` is handed over with a ticket (`track`), so that a 503
  the app answers for it is charged to this connection by the policy.

Pipelined requests (started when the answer before them is sent) and a connection whose client
does not read its answers (writing paused) take the app's path, which waits on the writes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar, cast

from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from service.admission.policy import AdmissionPolicy, Answer, Caller, Head, Outcome
from service.errors import Unavailable
from service.http import context
from service.http.bounded import BoundedProtocol


class EdgeProtocol(BoundedProtocol):
    """`http=` for uvicorn. Bound to the app's admission policy (`bound`), it decides every
    request from its head with it; unbound, it only enforces the bounds (from the
    environment's settings) and the app's gate decides."""

    policy: ClassVar[AdmissionPolicy | None] = None

    @classmethod
    def bound(cls, policy: AdmissionPolicy) -> type[EdgeProtocol]:
        """This protocol with `policy` and its settings."""
        attributes = {"policy": policy, "settings": policy.settings}
        return cast("type[EdgeProtocol]", type(cls.__name__, (cls,), attributes))

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._caller = Caller()  # what the policy remembers of this connection
        self._popping = False  # starting a pipelined request (`on_response_complete`)
        self._cpu_since = 0.0  # the loop thread's CPU clock when this read began (the charge)

    def data_received(self, data: bytes) -> None:
        self._cpu_since = time.thread_time()  # what a shed answered from this read costs
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._popping = True  # a pipelined request started now takes the app's path
        try:
            super().on_response_complete()
        finally:
            self._popping = False

    def _run_request(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._admit(cycle, app, may_hold=True)

    def _admit(
        self, cycle: RequestResponseCycle, app: ASGI3Application, *, may_hold: bool
    ) -> Outcome | None:
        """Hold the request (None), shed it here ("shed") or start its ASGI task
        ("admitted": to the app, which may still shed it)."""
        policy = self.policy
        if policy is None:
            super()._run_request(cycle, app)
            return "admitted"
        scope: Any = cycle.scope
        head = Head.APP
        if app is self.app and not self._popping and not self.flow.write_paused:
            if may_hold and policy.hold(scope, self._caller, self._release, cycle, app):
                self.flow.pause_reading()  # the kernel's buffers and the client's wait push back
                return None
            started = time.perf_counter()
            decision = policy.decide(scope)
            if isinstance(decision, Unavailable):
                self._shed(cycle, decision, started)
                return "shed"
            head = decision
        if scope["method"] == "POST":
            policy.track(scope, self._caller, admitted=head is Head.ADMITTED)
        super()._run_request(cycle, app)
        return "admitted"

    def _release(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """The policy lets a held request go: decide it again (admitted if there is room now,
        else shed) and read its connection again."""
        assert self.policy is not None
        if self.transport.is_closing() or cycle.disconnected:
            self.policy.released(self._caller, "gone")
            return
        if not self.pipeline:  # (uvicorn keeps a connection with pipelined requests paused)
            self.flow.resume_reading()
        self._cpu_since = time.thread_time()
        outcome = self._admit(cycle, app, may_hold=False)
        assert outcome is not None
        self.policy.released(self._caller, outcome)

    def _shed(self, cycle: RequestResponseCycle, error: Unavailable, started: float) -> None:
        """Answer a shed decided from the head (`started`: `perf_counter` as it was decided),
        as the app would (its `X-Request-ID`, metrics and log line), and charge it."""
        assert self.policy is not None
        scope: Any = cycle.scope
        request_id = context.request_id(scope["headers"])
        status, headers, body = self.policy.shed(scope, error, request_id, in_app=False)
        headers.append((b"x-request-id", request_id.encode()))
        seconds = time.perf_counter() - started
        context.record(scope, request_id, status, seconds, context.reason_of(error))
        self._write_answer(cycle, (status, headers, body))
        self.policy.charge_edge(self._caller, error, self._cpu_since)

    def _write_answer(self, cycle: RequestResponseCycle, answer: Answer) -> None:
        """Write the whole answer at once, as the cycle's `send` would (uvicorn's default
        headers, `connection: close` when the connection ends, the access log line if on), and
        end the cycle: llhttp still parses the body, which uvicorn then drops."""
        status, headers, body = answer
        cycle.response_started = cycle.response_complete = True
        cycle.waiting_for_100_continue = False  # the answer is final: no 100 Continue
        if cycle.access_log:
            scope = cycle.scope
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                status,
            )
        parts = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers):
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        self.transport.write(b"".join(parts))
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._close_after_answer()
        cycle.on_response()
