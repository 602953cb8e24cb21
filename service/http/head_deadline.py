"""The request head's deadline (REQUEST_HEAD_TIMEOUT_S) on one connection.

One timer per connection, moved on lazily: a request costs a clock read rather than a timer of
its own (`call_later` and `cancel` cost more than the rest of a request's bookkeeping).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class HeadDeadline:
    """A head began (`began`: the accept, or the next request's first byte) and must end
    (`ended`) within `timeout_s`, else `expired()` is called once. While `paused()` (the server
    holds the input back: pipelining) the clock starts again; while `closing()` it stops."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
        expired: Callable[[], None],
        paused: Callable[[], bool],
        closing: Callable[[], bool],
    ) -> None:
        self.timeout_s = timeout_s
        self._loop = loop
        self._expired, self._paused, self._closing = expired, paused, closing
        self._since: float | None = None  # when the head in progress began (loop time)
        self._timer: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        """A head is in progress."""
        return self._since is not None

    def began(self) -> None:
        self._since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self.timeout_s, self._check)

    def ended(self) -> None:
        self._since = None  # the timer stays: the next head moves it on

    def stop(self) -> None:
        self._since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        since = self._since
        if since is None or self._closing():
            return  # no head in progress: the next one arms a new timer
        if self._paused():  # not the client's delay
            self.began()
            return
        if (left := since + self.timeout_s - self._loop.time()) > 0:  # a later head
            self._timer = self._loop.call_later(left, self._check)
            return
        self._expired()
