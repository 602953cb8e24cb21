"""The hand-off from the event loop to the inference thread, bounded in inputs.

`WorkQueue.offer` is admission: it sheds (503) before any work when the queue is full or the
predicted wait exceeds the request's deadline; the lock is held only for list operations, so
the event loop never waits on inference.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from service import metrics
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.occupancy import Occupancy, RequestTally
from service.engine.jobs import Unit
from service.engine.types import Prepared
from service.errors import DeadlineExceeded, Overloaded


@dataclass(eq=False, kw_only=True)
class Item:
    """One unit of one request. `future` resolves to the unit's answer or a ServiceError."""

    unit: Unit
    deadline: float  # time.monotonic() seconds
    enqueued_at: float = field(default_factory=time.monotonic)
    future: Future[Any] = field(default_factory=Future)
    cancel_reason: str = "client_disconnect"  # set by the loop before it cancels the future
    prepared: Prepared | None = None
    passed_over: int = 0  # batches formed from its parameter group without it
    tally: RequestTally | None = None  # its request's stage, set when queued (`occupancy`)
    parent: Item | None = None  # the input this one is a part of (a window: `parts`)

    @property
    def tokens(self) -> int:
        """Its padded length once tokenized (0 before)."""
        return self.prepared.n_tokens if self.prepared is not None else 0

    def fail(self, error: BaseException) -> None:
        """Answer with `error`, unless already settled: the event loop cancels a queued input
        whenever its request ends (a sibling input failed, the deadline passed, the client
        left), and that can happen between any check of the thread and this call."""
        with contextlib.suppress(InvalidStateError):
            self.future.set_exception(error)

    def dropped(self) -> bool:
        """True when it must not be computed: its waiter left (counted by the reason the loop
        gave), or its deadline passed (counted, and answered 504). A part is dropped, and
        cancelled, once its input is settled (its waiter left, or another part failed)."""
        parent = self.parent
        if parent is not None and parent.future.done():
            self.future.cancel()
            if parent.future.cancelled():
                self.cancel_reason = parent.cancel_reason
            else:
                return True  # a sibling failed: its input's error is answered already
        if self.future.cancelled():
            if self.cancel_reason == "deadline":
                metrics.EXPIRED.labels("queued").inc()
            else:
                metrics.CANCELLED.labels(self.cancel_reason).inc()
            return True
        if time.monotonic() >= self.deadline:
            metrics.EXPIRED.labels("queued").inc()
            self.fail(DeadlineExceeded("the request deadline passed in the queue"))
            return True
        return False


class WorkQueue:
    """Items handed from the loop to the thread, bounded in inputs (MAX_QUEUE_SIZE).

    `depth` counts every input waiting: handed over but not yet in a running batch. The lock
    is held only for list operations, so the event loop never waits on inference.
    `occupancy` counts requests instead of inputs (waiting, running:
    `service.engine.batching.occupancy`).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._new: deque[Item] = deque()
        self._depth = 0
        self._inputs_per_request = 1.0  # moving mean over admitted requests (`room`)
        self._cond = threading.Condition()
        self.occupancy = Occupancy(metrics.REQUESTS_WAITING, metrics.REQUESTS_RUNNING)

    @property
    def depth(self) -> int:
        return self._depth

    def room(self) -> int:
        """How many more requests of the usual size fit now: the free inputs over the mean
        inputs of the requests admitted lately (a moving mean, weight 1/16 a request). Read
        without the lock, as `refusal` is from the head."""
        return int((self.capacity - self._depth) / max(1.0, self._inputs_per_request))

    def room_by(self, deadline: float, estimate: ServiceTimeEstimate) -> int:
        """`room()`, or 0 while a request of the usual size due by `deadline` (monotonic s)
        would be refused for its predicted wait (`refusal`): on a slow machine the queue can
        have free places that a deadline cannot use."""
        room = self.room()
        usual = max(1, round(self._inputs_per_request))
        if room > 0 and self.refusal(usual, deadline, estimate) is not None:
            return 0
        return room

    def refusal(self, n: int, deadline: float, estimate: ServiceTimeEstimate) -> Overloaded | None:
        """Why `n` more inputs due by `deadline` (monotonic) must be shed now, or None.

        Full queue, or a predicted wait past the deadline: shedding happens before any work
        (TEI's `try_acquire_permit`), so a request that would wait past its deadline is
        refused now instead of expiring in the queue (counted when answered: `errors.shed`
        reasons). Called by `offer` under the lock, and by the admission policy from the
        request head (`service.admission.policy`) without it: a stale read there only decides
        one request a batch late, and `offer` decides again."""
        depth = self._depth
        if depth + n > self.capacity:
            return Overloaded(
                f"queue full ({depth} of {self.capacity} inputs waiting); retry later",
                retry_after_s=estimate.predicted_wait(depth),
                shed="queue_full",
            )
        # Shed for the deadline only behind other work: alone on an idle server a request
        # starts at once, and its batch corrects an estimate that was too pessimistic
        # (otherwise one slow cold batch could shed short deadlines forever).
        idle = depth == 0 and not estimate.running()
        wait = estimate.predicted_wait(depth + n)
        if not idle and wait > deadline - time.monotonic():
            return Overloaded(
                f"predicted wait {wait:.1f}s exceeds the request deadline; retry later",
                retry_after_s=estimate.predicted_wait(depth),
                shed="deadline",
            )
        return None

    def offer(self, items: list[Item], estimate: ServiceTimeEstimate) -> None:
        """Queue all of `items` (one request's inputs) or none: raise `Overloaded` when full
        or too slow for them."""
        with self._cond:
            refusal = self.refusal(len(items), min(i.deadline for i in items), estimate)
            if refusal is not None:
                raise refusal
            self._inputs_per_request += (len(items) - self._inputs_per_request) / 16
            tally = self.occupancy.admit([i.future for i in items])
            for item in items:
                item.tally = tally
            self._new.extend(items)
            self._depth += len(items)
            metrics.QUEUE_DEPTH.set(self._depth)
            self._cond.notify()

    def take_new(self, timeout: float) -> list[Item]:
        """Everything handed over since the last call; block up to `timeout` s for the first."""
        with self._cond:
            if not self._new and timeout > 0:
                self._cond.wait(timeout)
            taken = list(self._new)
            self._new.clear()
            return taken

    def charge(self, n: int) -> None:
        """`n` more inputs wait than were offered: an input became several parts (its windows,
        `service.engine.batching.parts`), each counted from now on."""
        with self._cond:
            self._depth += n
            metrics.QUEUE_DEPTH.set(self._depth)

    def release(self, n: int) -> None:
        """`n` inputs left the waiting set (started, answered with an error, or dropped)."""
        with self._cond:
            self._depth -= n
            metrics.QUEUE_DEPTH.set(self._depth)

    def started(self, items: list[Item]) -> None:
        """`items` (futures just marked running) are in the batch being computed now."""
        self.occupancy.start((i.tally, i.future) for i in items)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()
