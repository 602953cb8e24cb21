"""A budget for sheds: the share of the event loop's CPU that answering 503s may take.

Each shed is cheap, but thousands a second still take the loop's core, and on a small machine
that comes out of the model: goodput falls however well the tarpit recognises retries. The
budget bounds what shedding may cost rather than guessing which requests are retries.

The rule
- A token bucket of loop CPU seconds, refilled at `SHED_BUDGET_SHARE` seconds per second
  (default 0.05: a twentieth of one core) up to `_BURST_S` (a burst of sheds is answered at
  once). Every 503 is charged what it cost the loop thread (`time.thread_time`): a shed the
  HTTP edge writes from the read that brought its head, one the app answers from when the app
  began; at least `_MIN_CHARGE_S`, since the loop's reads, polls and task switches fall outside
  what is measured, and at most `_MAX_CHARGE_S`, since other requests' work runs between the
  app's awaits. Charges stop at one burst of debt, so that a flood of first requests cannot
  hold the rest for longer than about one burst's refill.
- While the bucket is empty, a `POST` for model work on a connection whose last answer was a
  503 less than its Retry-After ago (a client that did not wait) is not answered: its
  connection stops being read (`pause_reading`; the kernel's socket buffers and the client's
  own wait push back) and it is held, first in first out.
- Held requests are released, oldest first, as the queue has room for them (`room`: free
  inputs over the inputs of a usual request, none while a usual request due by the oldest's
  deadline would be shed for its predicted wait; looked at every `_ROOM_TICK_S`), or when they
  have waited their longest hold or their deadline passes, room or not: each is decided again
  with the deadline it has left (admitted if its inputs fit by then, else shed and charged),
  and its connection is read again. A refilled bucket releases nothing by itself: while the
  queue is full a released request could only be shed, and its client would send the next at
  once. A storm's connections thus wait, unread, in arrival order.
- The longest hold is `_MAX_HOLD_S`, doubled for each of the connection's held requests before
  it that ended shed, one after another, up to 4 s (`longest_hold`); a request admitted, or one
  after a polite wait, starts it again at `_MAX_HOLD_S`.
- Never held: a connection's first request and any request after a polite wait (so a polite
  client's first shed, and a proxy's pooled connection at moderate overload, are answered at
  once: the bucket only runs dry when sheds come faster than `SHED_BUDGET_SHARE` allows);
  `GET`s (`/livez`, `/readyz`, `/metrics` never wait here).

`SHED_BUDGET_SHARE=0` turns it off. docs/overload.md gives the figures behind the defaults and
how to measure them.

Metrics: `pipeline_server_shed_cpu_seconds_total` (what sheds cost the loop),
`pipeline_server_shed_held_total{outcome}` (held requests, by how they ended) and
`pipeline_server_reads_paused` (connections not read now). A storm shows sheds and held requests
with a small queue wait; a slow model shows long queue waits with few of either.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from service import metrics

_BURST_S = 0.02  # loop CPU seconds the bucket holds when full (and the most debt it keeps)
# A held request waits at most this long (or to its deadline), budget or not: the shortest
# Retry-After a shed carries, which a polite client would have waited anyway.
_MAX_HOLD_S = 1.0
# A connection whose held requests keep ending shed is held longer each time: 1, 2, then 4 s
# (`longest_hold`), staying under the 5 s default timeout of httpx, the shortest of the usual
# Python clients, so that a held client gets its answer rather than timing out.
_HOLD_DOUBLINGS = 2
_MIN_TICK_S = 0.002  # the release timer never fires sooner than this after the last one
# How often the queue is looked at for room while requests are held (a batch frees room every
# few tens of ms; a look costs the loop a few microseconds).
_ROOM_TICK_S = 0.005
# The least a shed is charged: what is measured (from the read to the written answer) leaves
# out the loop's reads, polls and task switches, which a request costs too.
_MIN_CHARGE_S = 0.00025
# The most one is charged: on the app's path the loop runs other requests' work between the
# measure's two ends (each await), which is not this shed's.
_MAX_CHARGE_S = 0.002


def longest_hold(shed_after_holds: int) -> float:
    """The longest hold (s) for a connection whose last `shed_after_holds` held requests
    ended shed, one after another: `_MAX_HOLD_S` doubled each time, at most `_HOLD_DOUBLINGS`
    times."""
    return float(_MAX_HOLD_S * 2 ** min(max(shed_after_holds, 0), _HOLD_DOUBLINGS))


class _Held(NamedTuple):
    release: Callable[[], None]  # decide the request again and read its connection again
    latest: float  # monotonic: release by then, whatever the budget
    deadline: float  # monotonic: the request's own deadline


class ShedBudget:
    """The bucket and the held requests of one event loop. `share`: loop CPU seconds per second
    that sheds may take (> 0); `room(deadline)`: how many held requests the queue would admit
    now, the oldest being due by `deadline` (monotonic s). Not thread-safe: the loop's thread
    only."""

    def __init__(
        self, share: float, room: Callable[[float], int], burst_s: float | None = None
    ) -> None:
        self.share = share
        self._room = room
        self.burst_s = _BURST_S if burst_s is None else burst_s
        self._tokens = self.burst_s
        self._refilled_at = time.monotonic()
        self._held: deque[_Held] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def exhausted(self) -> bool:
        """True while sheds have spent their share (the bucket is empty)."""
        return self._refill() <= 0.0

    def charge(self, cpu_s: float) -> None:
        """A shed was answered at `cpu_s` seconds of loop CPU (charged at least
        `_MIN_CHARGE_S`, at most `_MAX_CHARGE_S`)."""
        cpu_s = min(max(cpu_s, _MIN_CHARGE_S), _MAX_CHARGE_S)
        metrics.SHED_CPU_SECONDS.inc(cpu_s)
        self._tokens = max(self._refill() - cpu_s, -self.burst_s)

    def hold(
        self, release: Callable[[], None], deadline: float, longest_s: float | None = None
    ) -> None:
        """Hold a request: `release()` is called once, in arrival order, when the queue has
        room, after `longest_s` (default `_MAX_HOLD_S`; `longest_hold`) or at `deadline`
        (monotonic s), whichever comes first."""
        longest_s = _MAX_HOLD_S if longest_s is None else longest_s
        latest = min(deadline, time.monotonic() + longest_s)
        self._held.append(_Held(release, latest, deadline))
        metrics.READS_PAUSED.set(len(self._held))
        self._schedule()

    def _refill(self) -> float:
        now = time.monotonic()
        self._tokens = min(self.burst_s, self._tokens + (now - self._refilled_at) * self.share)
        self._refilled_at = now
        return self._tokens

    def _schedule(self) -> None:
        if self._timer is not None or not self._held:
            return
        now = time.monotonic()
        at = max(min(now + _ROOM_TICK_S, self._held[0].latest), now + _MIN_TICK_S)
        self._timer = asyncio.get_running_loop().call_later(at - now, self._release_due)

    def _release_due(self) -> None:
        """Release as many held requests as the queue has room for, oldest first, and every
        one whose wait is over; then look again after `_ROOM_TICK_S`."""
        self._timer = None
        try:
            now = time.monotonic()
            room = self._room(self._held[0].deadline) if self._held else 0
            while self._held and (room > 0 or self._held[0].latest <= now):
                room -= 1
                self._held.popleft().release()
        finally:  # a release that raised must not leave the others held for good
            metrics.READS_PAUSED.set(len(self._held))
            self._schedule()
