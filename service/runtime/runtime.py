"""The server's runtime on the event loop: readiness, draining, submitting work and awaiting it.

A request's inputs are admitted all or none, then awaited until the first of: all results,
the client disconnecting (the ASGI `http.disconnect` message, not polling), the request's
deadline (504), or the end of the drain time after SIGTERM (503). Whatever it stops waiting
for is cancelled, so the inference thread drops it before compute.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.types import Scope

from service import metrics
from service.engine.face import Inference, Item, State
from service.engine.jobs import Unit
from service.engine.types import ModelInfo
from service.errors import (
    BadRequest,
    DeadlineExceeded,
    Draining,
    NotReady,
    ServiceError,
)
from service.runtime.body import header, read_body
from service.runtime.connection import connection_of
from service.runtime.deadlines import bulk_timeout, request_timeout
from service.settings import Settings

log = structlog.get_logger("service.runtime")

_LOADING_RETRY_S = 5  # Retry-After while the model loads or the pod drains (a fixed value)


def arrival(scope: Scope) -> float:
    """When the request arrived (monotonic s; set by the request-context middleware)."""
    arrived: float | None = scope.get("state", {}).get("arrived")
    return time.monotonic() if arrived is None else arrived


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Runtime:
    def __init__(self, settings: Settings, inference: Inference) -> None:
        self.settings = settings
        self.inference = inference
        self.draining = False
        # Resolved when the drain time ends, which settles every request still waiting.
        self._drain_over: asyncio.Future[None] | None = None
        self._waiting: set[_Waiter] = set()  # requests awaiting their answers (`wait`)
        self._drain_ends_at: float | None = None  # monotonic; set on SIGTERM
        self._reading: set[asyncio.Timeout] = set()  # body reads under way (`receive`)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the inference thread and chain a SIGTERM hook in front of the server's own.

        uvicorn's handler stops the listener and waits for open requests; ours first turns
        readiness off and starts the drain clock (README, Overload, deadlines and shutdown).
        """
        loop = asyncio.get_running_loop()
        self._drain_over = loop.create_future()
        self.inference.start()
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(self.begin_drain)
            if callable(previous):
                previous(signum, frame)

        # ValueError: not the main thread (in-process test clients), where no signal comes.
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, on_sigterm)

    def begin_drain(self) -> None:
        """Readiness off now; queued and running work has DRAIN_TIMEOUT_S to finish."""
        if self.draining:
            return
        self.draining = True
        metrics.READY.set(0)
        drain_s = self.settings.drain_timeout_s
        self._drain_ends_at = time.monotonic() + drain_s
        self.inference.drain_by(self._drain_ends_at)
        assert self._drain_over is not None
        loop = asyncio.get_running_loop()
        loop.call_later(drain_s, self._end_drain)
        for timeout in self._reading:  # bodies still arriving: at the drain end at the latest
            when = timeout.when()
            timeout.reschedule(min(when if when is not None else math.inf, loop.time() + drain_s))
        log.info("draining", drain_timeout_s=drain_s, queue_depth=self.inference.queue_depth)

    def _end_drain(self) -> None:
        assert self._drain_over is not None
        self._drain_over.set_result(None)
        for waiter in list(self._waiting):
            waiter.settle("drain")

    async def stop(self) -> None:
        """Stop the thread; after SIGTERM, only until shortly after the drain ends (gunicorn
        kills the worker DRAIN_TIMEOUT_S + 5 s after SIGTERM: shut down cleanly before that)."""
        budget = self.settings.drain_timeout_s + 5
        if self._drain_ends_at is not None:
            budget = max(0.5, self._drain_ends_at + 3 - time.monotonic())
        await asyncio.to_thread(self.inference.stop, budget)

    # -- probes --------------------------------------------------------------------------
    def live(self) -> tuple[bool, str]:
        """Liveness: the engine's health (`service.engine.face.Inference.health`)."""
        return self.inference.health()

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        return self.inference.state is State.READY, self.inference.state.value

    # -- requests ------------------------------------------------------------------------
    def model_info(self) -> ModelInfo:
        """The loaded model's info; raises 503 (with Retry-After) unless ready and not draining."""
        if self.draining:
            raise Draining(
                "the server is shutting down", retry_after_s=_LOADING_RETRY_S, shed="draining"
            )
        info = self.inference.info
        if self.inference.state is not State.READY or info is None:
            why = {State.LOADING: "the model is still loading"}.get(
                self.inference.state, self.inference.failure or "the model is not serving"
            )
            raise NotReady(why, retry_after_s=_LOADING_RETRY_S, shed="not_ready")
        return info

    def deadline(self, request: Request) -> float:
        """Monotonic deadline: REQUEST_TIMEOUT_S, or less if `X-Request-Timeout` asks for it,
        from the request's arrival (a held request counts its hold: `service.admission.policy`)."""
        timeout = self.timeout(header(request.scope, b"x-request-timeout"))
        if timeout is None:
            raise BadRequest("X-Request-Timeout must be a positive number of seconds")
        return arrival(request.scope) + timeout

    def job_deadline(self, request: Request, deadline: float, inputs: int) -> float:
        """The deadline of a request of `inputs` inputs: `deadline` (`deadline()`), or for a bulk
        request `deadlines.bulk_timeout` from its arrival."""
        if not self.inference.is_bulk(inputs):
            return deadline
        asked = header(request.scope, b"x-request-timeout")
        return arrival(request.scope) + bulk_timeout(self.settings, inputs, asked)

    def timeout(self, asked: str | bytes | None) -> float | None:
        """`deadlines.request_timeout` under this server's settings."""
        return request_timeout(self.settings, asked)

    async def receive(self, request: Request, deadline: float) -> bytes:
        """The body (413 past MAX_BODY_BYTES, as it streams in), read within the request's
        deadline (504) and the drain time (503): a client that stalls its upload holds its
        connection, and a draining server, no longer than that. Raises `ClientGone` when the
        client leaves during the upload.

        A body that has already arrived whole (what the server's `Connection` says) is read
        without a timer; otherwise one `asyncio.timeout` per read (no extra task: this is every
        request's path, sheds included), which SIGTERM pulls in to the drain end
        (`begin_drain`)."""
        link = connection_of(request.scope)
        if link is not None and link.body_complete():
            try:
                return await read_body(request, self.settings.max_body_bytes)
            except ClientDisconnect:
                raise ClientGone() from None
        ends = min(deadline, self._drain_ends_at or deadline)
        try:
            async with asyncio.timeout(max(0.0, ends - time.monotonic())) as timeout:
                self._reading.add(timeout)
                try:
                    return await read_body(request, self.settings.max_body_bytes)
                finally:
                    self._reading.discard(timeout)
        except ClientDisconnect:
            raise ClientGone() from None
        except TimeoutError:
            raise _body_too_late(self._drain_ends_at, deadline) from None

    def submit(self, units: Sequence[Unit], deadline: float) -> list[Item]:
        """Queue the units (all or none); raise `Overloaded` (503) to shed them."""
        items = [Item(unit=u, deadline=deadline) for u in units]
        self.inference.offer(items)
        return items

    async def run(
        self,
        units: Sequence[Unit],
        request: Request,
        deadline: float,
        paths: Sequence[str] | None = None,
    ) -> list[object]:
        """Admit the units, then await their answers (`submit`, then `wait`); `paths` name
        each unit's input in error messages (`inputs[2]`)."""
        return await self.wait(self.submit(units, deadline), request, deadline, paths)

    async def wait(
        self,
        items: list[Item],
        request: Request,
        deadline: float,
        paths: Sequence[str] | None = None,
    ) -> list[object]:
        """The answers, in order. Raises the first failed input's ServiceError (its message
        prefixed with its path), 504 at the deadline, 503 when the drain time ends, or
        `ClientGone` when the client disconnects.

        One asyncio future is settled by whichever comes first (no task or future per unit):
        the inference thread calls back once, thread-safely, when the last unit is answered or
        one fails; a timer at the deadline; the drain end; the connection's close (a callback
        from the server's `Connection`, else a task awaiting `http.disconnect`)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, len(items))
        for item in items:
            item.future.add_done_callback(waiter.unit_done)
        timer = loop.call_at(
            loop.time() + max(0.0, deadline - time.monotonic()), waiter.settle, "deadline"
        )
        assert self._drain_over is not None
        if self._drain_over.done():
            waiter.settle("drain")
        self._waiting.add(waiter)
        link = connection_of(request.scope)
        stop_watching: Callable[[], object]
        if link is not None:
            stop_watching = link.on_gone(waiter.settle_gone)
        else:
            stop_watching = loop.create_task(_watch_disconnect(request, waiter)).cancel
        try:
            why = await waiter.future
        finally:
            timer.cancel()
            stop_watching()
            self._waiting.discard(waiter)
        return _answers(items, why, paths)


def _answers(items: list[Item], why: str, paths: Sequence[str] | None) -> list[object]:
    """The items' answers once the wait ended for `why` (`_Waiter`), or what it raises: the
    first failed input's error (named by its path), else why it stopped."""
    failed = _first_failure(items)
    if failed is not None:  # one input failed: the request is over,
        _abandon(items, "request_failed")  # so its other inputs cost nothing
        _name_the_input(items, failed, paths)
        raise failed
    if why != "gone" and all(i.future.done() for i in items):
        return [i.future.result() for i in items]  # answered, even if at the last moment
    reason, error = _why_stopped(why == "gone", why == "drain")
    _abandon(items, reason)
    raise error


def _body_too_late(drain_ends_at: float | None, deadline: float) -> Exception:
    """What a body still arriving when its time ran out gets: the drain's end (503) where it
    came first, else the deadline (504); its answer closes the connection (its rest unread)."""
    if drain_ends_at is not None and drain_ends_at <= deadline:
        draining = Draining("drain time is over", retry_after_s=_LOADING_RETRY_S)
        draining.headers["Connection"] = "close"
        return draining
    metrics.EXPIRED.labels("receiving").inc()
    return DeadlineExceeded(
        "the request deadline passed while its body was still arriving",
        headers={"Connection": "close"},
    )


def _abandon(items: list[Item], reason: str) -> None:
    """Cancel the inputs now (synchronously, so the thread skips any still queued)."""
    for item in items:
        item.cancel_reason = reason
        if not item.future.cancel() and not item.future.done() and reason == "deadline":
            metrics.EXPIRED.labels("running").inc()  # too late to skip: its batch runs


def _why_stopped(client_gone: bool, drain_over: bool) -> tuple[str, Exception]:
    if client_gone:
        return "client_disconnect", ClientGone()
    if drain_over:
        return "drain_timeout", Draining("drain time is over", retry_after_s=_LOADING_RETRY_S)
    return "deadline", DeadlineExceeded("the request deadline passed before its answer")


class _Waiter:
    """One request's wake-up: an asyncio future settled once, on the loop, with why the wait
    ended ("done", "deadline", "drain", "gone"). `unit_done` runs in whichever thread settles
    a unit's concurrent future (the inference thread; the loop when it cancels)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, units: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[str] = loop.create_future()
        self._left = units
        self._lock = threading.Lock()

    def unit_done(self, future: concurrent.futures.Future[object]) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last or (not future.cancelled() and future.exception() is not None):
            self.loop.call_soon_threadsafe(self.settle, "done")

    def settle(self, why: str) -> None:
        if not self.future.done():
            self.future.set_result(why)

    def settle_gone(self) -> None:
        self.settle("gone")


def _first_failure(items: list[Item]) -> BaseException | None:
    """The exception of the first input (in order) that failed, if any."""
    for item in items:
        future = item.future
        if future.done() and not future.cancelled() and future.exception() is not None:
            return future.exception()
    return None


def _name_the_input(items: list[Item], failed: BaseException, paths: Sequence[str] | None) -> None:
    """Prefix a 4xx message with the failing input's path (`inputs[2]`, and the error's own
    `at` inside it: `input[3]` for a late-chunked document's fourth chunk), when it has one."""
    if not paths or not isinstance(failed, ServiceError) or failed.status >= 500:
        return
    for item, path in zip(items, paths, strict=True):
        future = item.future
        if future.done() and not future.cancelled() and future.exception() is failed:
            failed.message = f"{path}{failed.at}: {failed.message}"
            return


async def _watch_disconnect(request: Request, waiter: _Waiter) -> None:
    """Settle `waiter` when the ASGI server reports `http.disconnect` for this request."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            waiter.settle("gone")
            return


__all__ = ["ClientGone", "Runtime", "arrival"]
