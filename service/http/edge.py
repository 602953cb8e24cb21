"""The HTTP edge: uvicorn's httptools protocol with the limits llhttp lacks (issue 14).

- Each request head is bounded exactly (MAX_REQUEST_HEAD_BYTES, else 431): `service.http.framing`
  cuts the stream and llhttp is fed one head or body at a time, so the bytes are counted
  before llhttp parses them, in one read or dribbled, pipelined or not.
- Each head has a deadline (REQUEST_HEAD_TIMEOUT_S, else 408), from the accept or from the next
  request's first byte: a connection that sends nothing, or a slow head, is closed. Idle
  keep-alive connections keep uvicorn's own timeout (gunicorn `keepalive`).
- Open connections are bounded (MAX_CONNECTIONS): at the bound an idle keep-alive connection
  is closed to make room; when none is idle, one more is answered 503 at once and closed,
  without reading it; an answer tells a client or a load balancer why, where a bare close
  looks like a network fault.
- What llhttp accepts and RFC 9112 or h11 (the parser used before) refuse: no Host or two in
  HTTP/1.1 (§3.2), Transfer-Encoding in HTTP/1.0 (§6.1), a transfer coding besides chunked
  (501). llhttp itself refuses Content-Length with Transfer-Encoding, a malformed or repeated
  Content-Length, control bytes in header values, obs-fold, bare CR or LF (tests/http/test_edge.py).

Sheds decided from the head (`service.http.shed_gate`) are answered here when the head ends, before
an
ASGI task, middleware or message exists: the app's shed gate leaves itself in the lifespan
state (`HEAD_SHEDDER`) and gives the whole answer (`shed_now`), or None to let the app have the
request.

The shed budget (`service.admission.budget`, issue 24) bounds what sheds may cost the loop: each 503
(written here, or by the app: `_AnswerTransport` sees its status line) is charged its CPU, and
while the budget is spent an inference `POST` on a connection that did not wait for its last
Retry-After is held with its connection not read (`_hold`), then decided again when the
budget allows (`_release`).

Every refusal is counted in `pipeline_server_http_refused_total{reason}` and logged at most
once per second per reason (`service.admission.refusals`). A refusal waits for the answers already
under
way on its connection (pipelining), then closes it after a short linger (below).

The app's own answers that close the connection before the request's body has all arrived
(413 over MAX_BODY_BYTES, a 504 or 503 during a stalled upload) linger the same way: a client
that sends its whole body before it reads (Python's http.client) would otherwise meet a reset
in the middle of its upload (a broken pipe) and never see the answer.
"""

from __future__ import annotations

import asyncio
import functools
import time
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

import httptools
import structlog
from uvicorn._types import ASGI3Application, Scope
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string, get_remote_addr
from uvicorn.server import ServerState

from service import metrics
from service.admission.budget import CPU_AT, ShedBudget, longest_hold
from service.admission.refusals import Refusal, answer, record, throttled
from service.http.framing import Framer, Step
from service.settings import Settings, load_settings

log = structlog.get_logger("service.edge")

# After a refusal the answer is followed by a FIN, and what the client still sends (the rest
# of an oversize head, an upload) is read and dropped for this long: closing with unread input
# makes the kernel reset the connection, which can destroy the answer before it is read
# (nginx's "lingering close", `lingering_time`). The client's own close ends it sooner.
_LINGER_S = 2.0
# ... and for at most this many bodies' worth of bytes (MAX_BODY_BYTES each; at least
# `_LINGER_MIN_BYTES`): a client sending far more is reset, as before, rather than read.
_LINGER_BODIES = 4
_LINGER_MIN_BYTES = 256 * 1024

HEAD_SHEDDER = "service.http.edge.head_shedder"  # the lifespan state's key for a `HeadShedder`
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body


class HeadShedder(Protocol):
    budget: ShedBudget | None  # None: sheds are not budgeted (SHED_BUDGET_SHARE=0)

    def deadline(self, scope: Scope) -> float | None:
        """The deadline (monotonic s) of a request the shedder may shed, else None."""

    def shed_now(self, scope: Scope) -> Answer | None:
        """The whole answer for a request to shed from its head (its metrics and log line
        recorded), or None: the app answers it."""


@functools.cache
def _env_settings() -> Settings:
    return load_settings()


class _AnswerTransport(asyncio.Transport):
    """The transport a request's cycle writes its answer to: the connection's own, except
    that uvicorn's close after an answer with `connection: close` goes to `close` (the
    protocol's `_close_after_answer`, which may linger first)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        close: Callable[[], None],
        shed: Callable[[bytes | bytearray | memoryview], None],
    ) -> None:
        super().__init__()
        self._transport = transport
        self._close = close
        self._shed = shed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data[:12] == b"HTTP/1.1 503":  # a response head: a shed answered by the app
            self._shed(data)
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class EdgeProtocol(HttpToolsProtocol):
    """`http=` for uvicorn. Limits come from `settings` (`with_settings`), else the environment."""

    settings: ClassVar[Settings | None] = None

    @classmethod
    def with_settings(cls, settings: Settings) -> type[EdgeProtocol]:
        return cast("type[EdgeProtocol]", type(cls.__name__, (cls,), {"settings": settings}))

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = self.settings or _env_settings()
        self._max_connections = settings.max_connections
        self._head_timeout_s = settings.request_head_timeout_s
        self._framer = Framer(settings.max_request_head_bytes)
        self._linger_bytes = max(_LINGER_BODIES * settings.max_body_bytes, _LINGER_MIN_BYTES)
        self._linger_left: int | None = None  # bytes still to drop; None: not lingering
        self._answer_transport: _AnswerTransport  # set with the transport (connection_made)
        self._head_timer: TimerHandle | None = None
        self._head_since: float | None = None  # when the head in progress began (loop time)
        self._refusal: Refusal | None = None  # set: nothing more is parsed
        self._pending: Refusal | None = None  # to answer once earlier answers are sent
        self._body = (0, False)  # the current request's Content-Length, chunked
        self._head_ended = self._message_ended = False  # llhttp's view, per fed part
        self._popping = False  # starting a pipelined request (`on_response_complete`)
        self._releasing = False  # deciding a request the shed budget held (`_release`)
        self._cpu_since = 0.0  # the loop thread's CPU clock when this read began (the charge)
        self._retry_at = 0.0  # monotonic: the Retry-After of this connection's last shed
        self._held_shed = 0  # this connection's held requests shed in a row (`longest_hold`)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._max_connections and not self._close_an_idle_one():
            self.transport = transport
            self.client = get_remote_addr(transport)
            self._refusal = Refusal(503, "connection_limit", "too many open connections")
            record(self._refusal, self.client)
            transport.write(answer(self._refusal, self.server_state.default_headers))
            transport.close()  # no linger: this connection must not hold its descriptor
            return
        super().connection_made(transport)
        self._answer_transport = _AnswerTransport(
            transport, self._close_after_answer, self._app_shed
        )
        self._head_began()

    def _close_an_idle_one(self) -> bool:
        """At the bound, close one idle keep-alive connection (between requests, waiting for
        uvicorn's keep-alive timeout) to make room, as nginx reuses its idle connections: a
        flood of idle connections then cannot lock out new clients, the kubelet's probes
        included. False when every connection is busy with a request (then this one is
        refused)."""
        for other in self.connections:
            if isinstance(other, HttpToolsProtocol) and other.timeout_keep_alive_task is not None:
                other.timeout_keep_alive_handler()  # uvicorn's own close of an idle connection
                return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._cpu_since = time.thread_time()  # what a shed answered from this read costs
        if self._linger_left is not None:  # answered and half-closed: drop, within the bound
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        start, size = 0, len(data)
        while start < size and self._refusal is None and not self._framer.closed:
            if self._head_since is None and self._framer.idle:
                self._head_began()  # the next request's first byte starts its deadline
            in_head = self._framer.in_head
            end, step = self._framer.take(data, start)
            if step is Step.TOO_LARGE:
                limit = self._framer.limit
                part = "request head" if in_head else "chunk size line or trailer section"
                message = f"{part} over {limit} bytes (MAX_REQUEST_HEAD_BYTES)"
                self._refuse(Refusal(431, "head_too_large", message), in_head)
                return
            if step is Step.MALFORMED:
                self._refuse(Refusal(400, "bad_request", "invalid chunk size"), in_head)
                return
            self._head_ended = self._message_ended = False
            piece = data if end - start == size else memoryview(data)[start:end]
            if not self._feed(piece, in_head):
                return
            start, ended_head = end, step is Step.HEAD_END
            if ended_head and self._head_ended:
                step = self._framer.start_body(*self._body)
            if (self._head_ended, self._message_ended) != (ended_head, step is Step.MESSAGE_END):
                left_out = throttled("framing_disagreement")
                if left_out is not None:  # at most one line a second: clients can cause it
                    log.error(
                        "framing_disagreement",
                        step=step.name,
                        llhttp_ended=self._message_ended,
                        unlogged_before=left_out,
                    )
                self._refuse(Refusal(400, "bad_request", "unclear request framing"), in_head)
                return
            if step is Step.MESSAGE_END and not self.cycle.keep_alive:
                self._framer.close()  # llhttp ignores what follows; uvicorn closes after

    def _feed(self, part: bytes | memoryview, in_head: bool) -> bool:
        try:
            self.parser.feed_data(part)
        except httptools.HttpParserUpgrade:
            self._framer.close()
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:  # answered as plain HTTP (uvicorn's way), then closed: what follows is unclear
                self._unsupported_upgrade_warning()
                if self.cycle is not None:
                    self.cycle.keep_alive = False
            return False
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, httptools.HttpParserInvalidURLError):  # uvicorn's on_url
                cause = Refusal(400, "bad_request", "invalid request target (the URL)")
            elif not isinstance(cause, Refusal):
                if isinstance(cause, Exception):  # a callback failed: a bug, not the client
                    left_out = throttled("http_callback_error")
                    if left_out is not None:  # at most once a second: clients can cause it
                        log.error("http_callback_error", exc_info=cause, unlogged_before=left_out)
                cause = Refusal(400, "bad_request", f"invalid HTTP request: {exc}")
            self._refuse(cause, in_head)
            return False
        return True

    # llhttp callbacks
    def on_headers_complete(self) -> None:
        self._head_since = None
        self._head_ended = True
        length, coding, hosts = 0, None, 0
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)  # llhttp checked it: digits (and OWS), one header
            elif name == b"transfer-encoding":
                coding = value.strip(b" \t").lower()
            elif name == b"host":
                hosts += 1
        if hosts != 1 or coding is not None:  # (most requests skip the version check)
            self._check_framing_headers(hosts, coding)
        self._body = (length, coding is not None)
        super().on_headers_complete()

    def _check_framing_headers(self, hosts: int, coding: bytes | None) -> None:
        version = self.parser.get_http_version()
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            raise Refusal(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header")
        if coding is not None and version == "1.0":
            raise Refusal(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request")
        if coding is not None and coding != b"chunked":  # llhttp: chunked is the last one
            raise Refusal(501, "not_implemented", "only Transfer-Encoding: chunked is supported")

    def on_message_complete(self) -> None:
        self._message_ended = True
        super().on_message_complete()

    # Sheds from the head
    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """uvicorn's start of a request's ASGI task, unless its head alone sheds it. Pipelined
        requests (started from `on_response_complete`) and a connection whose client does not
        read its answers (writing paused) take the app's path, which waits on the writes."""
        self._unset_keepalive_if_required()  # a request is under way: this connection is busy
        cycle.transport = self._answer_transport  # its close may linger (`_close_after_answer`)
        shedder: HeadShedder | None = self.app_state.get(HEAD_SHEDDER)
        ours = app is self.app and not self._popping and not self.flow.write_paused
        if shedder is not None and ours:
            budget = shedder.budget
            if budget is not None and not self._releasing and self._hold(cycle, app, shedder):
                return
            if answer := shedder.shed_now(cycle.scope):
                self._send_shed(cycle, *answer)
                self._charge(answer[1], budget)
                return
        super()._start_asgi_task(cycle, app)

    # The shed budget (service.admission.budget)
    def _charge(self, headers: list[tuple[bytes, bytes]], budget: ShedBudget | None) -> None:
        """After a shed written here: remember its Retry-After (a request before then did not
        wait) and charge the budget the loop CPU since this read began."""
        retry_after = next((v for k, v in headers if k == b"retry-after"), b"1")
        self._retry_at = time.monotonic() + float(retry_after)
        if budget is not None:
            budget.charge(time.thread_time() - self._cpu_since)

    def _app_shed(self, head: bytes | bytearray | memoryview) -> None:
        """A 503 answered on the app's path (a request the head let through, whose inputs did
        not fit when counted; a held retry; a pipelined one): charged as the edge's own are,
        from when the app began (`CPU_AT`), and this connection asked to wait. A `GET`'s 503
        (`/readyz` while loading or draining, `/livez` with a stuck batch) is a probe's answer,
        not a shed: neither."""
        if self.cycle is None or self.cycle.scope["method"] != "POST":
            return
        self._retry_at = time.monotonic() + 1.0  # the least Retry-After a shed carries
        shedder: HeadShedder | None = self.app_state.get(HEAD_SHEDDER)
        if shedder is not None and shedder.budget is not None:
            began = self.cycle.scope["state"].get(CPU_AT, self._cpu_since)
            shedder.budget.charge(time.thread_time() - began)

    def _hold(
        self, cycle: RequestResponseCycle, app: ASGI3Application, shedder: HeadShedder
    ) -> bool:
        """Hold the request, and stop reading its connection, when the budget is spent, this
        connection's last shed asked it to wait longer, and the request is one the shedder may
        shed (a POST for model work: whether the head or the app would shed it, it is decided
        when released). Its deadline runs from now (the request context keeps `arrived`)."""
        budget = shedder.budget
        assert budget is not None  # (the caller checked)
        if time.monotonic() >= self._retry_at:
            self._held_shed = 0  # a first request or a polite one: a hold starts short again
            return False
        if not budget.exhausted():
            return False  # sheds within their share
        cycle.scope["state"]["arrived"] = time.monotonic()
        deadline = shedder.deadline(cycle.scope)
        if deadline is None:
            return False
        self.flow.pause_reading()  # the kernel's buffers and the client's wait push back
        release = functools.partial(self._release, cycle, app)
        budget.hold(release, deadline, longest_hold(self._held_shed))
        return True

    def _release(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """The budget lets a held request go: decide it again (admitted if there is room now,
        else shed and charged) and read its connection again."""
        if self.transport.is_closing() or cycle.disconnected:
            metrics.SHED_HELD.labels("gone").inc()
            return
        if not self.pipeline:  # (uvicorn keeps a connection with pipelined requests paused)
            self.flow.resume_reading()
        self._cpu_since = time.thread_time()
        self._releasing = True
        try:
            self._start_asgi_task(cycle, app)
        finally:
            self._releasing = False
        shed = cycle.response_complete  # (answered from the head: a 503)
        self._held_shed = self._held_shed + 1 if shed else 0
        metrics.SHED_HELD.labels("shed" if shed else "admitted").inc()

    def _send_shed(
        self,
        cycle: RequestResponseCycle,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        """Write the whole answer at once, as the cycle's `send` would (uvicorn's default
        headers, `connection: close` when the connection ends, the access log line if on), and
        end the cycle: llhttp still parses the body, which uvicorn then drops."""
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

    # Refusals
    def _refuse(self, refusal: Refusal, in_head: bool) -> None:
        self._refusal = refusal
        self._framer.close()
        self._stop_head_timer()
        record(refusal, self.client)
        if not in_head:  # the body of the last request parsed: answer it in its place
            cycle = self.cycle
            if self.pipeline or cycle.response_started:
                self.transport.close()  # an answer is already under way: no second one
                return
            cycle.disconnected = True  # the app stops waiting for the rest of the body
            cycle.message_event.set()
        elif self._busy():  # pipelined: the earlier requests are answered first
            self._pending = refusal
            self.flow.pause_reading()
            return
        self._answer(refusal)

    def _busy(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def on_response_complete(self) -> None:
        self._popping = True  # a pipelined request started now takes the app's path
        try:
            super().on_response_complete()
        finally:
            self._popping = False
        pending = self._pending
        if pending is not None and not self._busy() and not self.transport.is_closing():
            self._pending = None
            self._answer(pending)

    def _answer(self, refusal: Refusal) -> None:
        self.transport.write(answer(refusal, self.server_state.default_headers))
        self._linger()

    def _close_after_answer(self) -> None:
        """Close after an answer that ends the connection; while the request's body is still
        arriving, linger first, so that a client still sending reads the answer."""
        if self._framer.in_body and not self.transport.is_closing():
            self._framer.close()  # the rest of the body is dropped, not parsed
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        """Half-close after the answer, then read and drop what the client still sends until
        it closes, `_LINGER_S` passes or `_linger_bytes` are dropped, whichever comes first."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._linger_left = self._linger_bytes
        self.flow.resume_reading()  # drop what arrives (data_received), until EOF or the linger
        self.loop.call_later(_LINGER_S, self.transport.close)

    # The head deadline: one timer per connection, moved on lazily, so that a request costs a
    # clock read rather than a timer of its own (call_later + cancel cost more than the rest).
    def _head_began(self) -> None:
        self._head_since = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._check_head)

    def _stop_head_timer(self) -> None:
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _check_head(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None or self.transport.is_closing():
            return  # no head in progress: the next one arms a new timer
        if self.flow.read_paused:  # uvicorn holds the input back (pipelining): not the client
            self._head_began()
            return
        if (left := since + self._head_timeout_s - self.loop.time()) > 0:  # a later head
            self._head_timer = self.loop.call_later(left, self._check_head)
            return
        message = f"request head not received within {self._head_timeout_s:g} s"
        self._refuse(Refusal(408, "head_timeout", message), in_head=True)
