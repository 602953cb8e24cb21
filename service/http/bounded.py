"""uvicorn's httptools protocol with the bounds llhttp lacks, and the refusals that enforce them.

- Each request head is bounded exactly (MAX_REQUEST_HEAD_BYTES, else 431): `service.http.framing`
  cuts the stream and llhttp is fed one head or body at a time, so the bytes are counted
  before llhttp parses them, in one read or dribbled, pipelined or not.
- Each head has a deadline (REQUEST_HEAD_TIMEOUT_S, else 408), from the accept or from the next
  request's first byte (`service.http.head_deadline`): a connection that sends nothing, or a
  slow head, is closed. Idle keep-alive connections keep uvicorn's own timeout (gunicorn
  `keepalive`).
- Open connections are bounded (MAX_CONNECTIONS): at the bound an idle keep-alive connection
  is closed to make room; when none is idle, one more is answered 503 at once and closed,
  without reading it; an answer tells a client or a load balancer why, where a bare close
  looks like a network fault.
- What llhttp accepts and RFC 9112 or h11 refuse: no Host or two in HTTP/1.1 (§3.2),
  Transfer-Encoding in HTTP/1.0 (§6.1), a transfer coding besides chunked (501). llhttp itself
  refuses Content-Length with Transfer-Encoding, a malformed or repeated Content-Length, control
  bytes in header values, obs-fold, bare CR or LF (tests/http/test_edge.py).

Every refusal is counted in `pipeline_server_http_refused_total{reason}` and logged at most
once per second per reason (`service.http.refusals`). A refusal waits for the answers
already under way on its connection (pipelining), then closes it after a short linger. The
app's own answers that close the connection before the request's body has all arrived (413
over MAX_BODY_BYTES, a 504 or 503 during a stalled upload) linger the same way: a client that
sends its whole body before it reads (Python's http.client) would otherwise meet a reset in
the middle of its upload (a broken pipe) and never see the answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import httptools
import structlog
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from service.http.framing import Framer, Step
from service.http.head_deadline import HeadDeadline
from service.http.refusals import Refusal, answer, record, throttled
from service.runtime import connection
from service.settings import Settings, process_settings

log = structlog.get_logger("service.edge")

# After a refusal the answer is followed by a FIN, and what the client still sends (the rest
# of an oversize head, an upload) is read and dropped for this long: closing with unread input
# makes the kernel reset the connection, which can destroy the answer before it is read
# (nginx's "lingering close", `lingering_time`). The client's own close ends it sooner.
_LINGER_S = 2.0
# ... and for at most this many bodies' worth of bytes (MAX_BODY_BYTES each; at least
# `_LINGER_MIN_BYTES`): a client sending far more is reset rather than read.
_LINGER_BODIES = 4
_LINGER_MIN_BYTES = 256 * 1024


class _AnswerTransport(asyncio.Transport):
    """The transport a request's cycle writes its answer to: the connection's own, except that
    - an answer's head (status line and headers, which uvicorn writes as its own part) is held
      and written with the answer's first body part, one system call and one TCP segment for
      a small answer where uvicorn makes two; `answered()` (the protocol's
      `on_response_complete`) and `close` write a head still held (an answer without a body:
      HEAD, 204);
    - uvicorn's close after an answer with `connection: close` goes to `close` (the
      protocol's `_close_after_answer`, which may linger first)."""

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        super().__init__()
        self._transport = transport
        self._close = close
        self._head: bytes | None = None  # the head written for the answer under way
        self._headless = True  # no head written since the last answer ended

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._headless and data != _CONTINUE:
            self._headless = False  # (uvicorn's 100 Continue, before the answer, goes now)
            self._head = bytes(data)
            return
        head, self._head = self._head, None
        self._transport.write(data if head is None else b"".join((head, data)))

    def answered(self) -> None:
        """The answer is complete: write its head if it is still held; the next write is the
        next answer's head."""
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)
        self._headless = True

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.answered()
        self._close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # what uvicorn's receive writes for Expect


def _stop_nothing() -> None:
    pass


class _Connection:
    """`service.runtime.connection.Connection` for one request (`cycle`) of `protocol`."""

    __slots__ = ("_cycle", "_protocol")

    def __init__(self, protocol: BoundedProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol, self._cycle = protocol, cycle

    def body_complete(self) -> bool:
        return not self._cycle.more_body

    def on_gone(self, callback: Callable[[], None]) -> Callable[[], object]:
        cycle = self._cycle
        if cycle.disconnected:
            callback()
            return _stop_nothing
        gone = self._protocol._gone
        gone[cycle] = callback
        return functools.partial(gone.pop, cycle, None)


def close_an_idle_one(connections: Iterable[object]) -> bool:
    """Close one idle keep-alive connection (between requests, waiting for uvicorn's
    keep-alive timeout) to make room, as nginx reuses its idle connections: a flood of idle
    connections then cannot lock out new clients, the kubelet's probes included. False when
    every connection is busy with a request."""
    for other in connections:
        if isinstance(other, HttpToolsProtocol) and other.timeout_keep_alive_task is not None:
            other.timeout_keep_alive_handler()  # uvicorn's own close of an idle connection
            return True
    return False


def _check_framing_headers(version: str, hosts: int, coding: bytes | None) -> None:
    """Raise the refusal of a request head with `hosts` Host headers and the transfer coding
    `coding` (lower case; None: no Transfer-Encoding) in HTTP `version`, if it has one."""
    if hosts > 1 or (hosts == 0 and version == "1.1"):
        raise Refusal(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header")
    if coding is not None and version == "1.0":
        raise Refusal(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request")
    if coding is not None and coding != b"chunked":  # llhttp: chunked is the last one
        raise Refusal(501, "not_implemented", "only Transfer-Encoding: chunked is supported")


def _refusal_for(exc: httptools.HttpParserError) -> Refusal:
    """The refusal of what llhttp refused: ours when a callback raised one (the head checks),
    else a 400 naming llhttp's reason."""
    cause = exc.__context__
    if isinstance(cause, Refusal):
        return cause
    if isinstance(cause, httptools.HttpParserInvalidURLError):  # uvicorn's on_url
        return Refusal(400, "bad_request", "invalid request target (the URL)")
    if isinstance(cause, Exception):  # a callback failed: a bug, not the client
        left_out = throttled("http_callback_error")
        if left_out is not None:  # at most once a second: clients can cause it
            log.error("http_callback_error", exc_info=cause, unlogged_before=left_out)
    return Refusal(400, "bad_request", f"invalid HTTP request: {exc}")


def _framing(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, bytes | None, int]:
    """A head's Content-Length (0 without one), its Transfer-Encoding (lower case, or None)
    and how many Host headers it has."""
    length, coding, hosts = 0, None, 0
    for name, value in headers:
        if name == b"content-length":
            length = int(value)  # llhttp checked it: digits (and OWS), one header
        elif name == b"transfer-encoding":
            coding = value.strip(b" \t").lower()
        elif name == b"host":
            hosts += 1
    return length, coding, hosts


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of `settings` (the environment's when the
    class is not given any: `service.http.edge.EdgeProtocol.bound`)."""

    settings: ClassVar[Settings | None] = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = self.settings or process_settings()
        self._max_connections = settings.max_connections
        self._framer = Framer(settings.max_request_head_bytes)
        self._linger_bytes = max(_LINGER_BODIES * settings.max_body_bytes, _LINGER_MIN_BYTES)
        self._linger_left: int | None = None  # bytes still to drop; None: not lingering
        self._answer_transport: _AnswerTransport  # set with the transport (connection_made)
        self._head = HeadDeadline(
            self.loop,
            settings.request_head_timeout_s,
            expired=self._head_expired,
            paused=lambda: self.flow.read_paused,  # uvicorn holds the input back (pipelining)
            closing=lambda: self.transport.is_closing(),
        )
        self._refusal: Refusal | None = None  # set: nothing more is parsed
        self._pending: Refusal | None = None  # to answer once earlier answers are sent
        self._body = (0, False)  # the current request's Content-Length, chunked
        # What to call if the connection closes before a request's answer (`_Connection`).
        self._gone: dict[RequestResponseCycle, Callable[[], None]] = {}
        self._head_ended = self._message_ended = False  # llhttp's view, per fed part

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._max_connections and not close_an_idle_one(
            self.connections
        ):
            self.transport = transport
            self.client = get_remote_addr(transport)
            self._refusal = Refusal(503, "connection_limit", "too many open connections")
            record(self._refusal, self.client)
            transport.write(answer(self._refusal, self.server_state.default_headers))
            transport.close()  # no linger: this connection must not hold its descriptor
            return
        super().connection_made(transport)
        self._answer_transport = _AnswerTransport(transport, self._close_after_answer)
        self._head.began()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head.stop()
        super().connection_lost(exc)
        gone, self._gone = self._gone, {}
        for cycle, callback in gone.items():
            if not cycle.response_complete:
                callback()

    def data_received(self, data: bytes) -> None:
        if self._linger_left is not None:  # answered and half-closed: drop, within the bound
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        start, size = 0, len(data)
        while start < size and self._refusal is None and not self._framer.closed:
            if not self._head.running and self._framer.idle:
                self._head.began()  # the next request's first byte starts its deadline
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
            self._refuse(_refusal_for(exc), in_head)
            return False
        return True

    # llhttp callbacks
    def on_headers_complete(self) -> None:
        self._head.ended()
        self._head_ended = True
        length, coding, hosts = _framing(self.headers)
        if hosts != 1 or coding is not None:  # (most requests skip the version check)
            _check_framing_headers(self.parser.get_http_version(), hosts, coding)
        self._body = (length, coding is not None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message_ended = True
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._unset_keepalive_if_required()  # a request is under way: this connection is busy
        cycle.transport = self._answer_transport  # its close may linger (`_close_after_answer`)
        scope: Any = cycle.scope  # (uvicorn's type for it lists the ASGI spec's extensions)
        scope["extensions"] = {connection.EXTENSION: _Connection(self, cycle)}
        self._run_request(cycle, app)

    def _run_request(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """Start the request's ASGI task (uvicorn's way; `EdgeProtocol` admits it first)."""
        super()._start_asgi_task(cycle, app)

    # Refusals
    def _refuse(self, refusal: Refusal, in_head: bool) -> None:
        self._refusal = refusal
        self._framer.close()
        self._head.stop()
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

    def _head_expired(self) -> None:
        message = f"request head not received within {self._head.timeout_s:g} s"
        self._refuse(Refusal(408, "head_timeout", message), in_head=True)

    def _busy(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def on_response_complete(self) -> None:
        self._answer_transport.answered()
        super().on_response_complete()
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
