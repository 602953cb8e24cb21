"""The hand-off from the event loop to the inference thread, bounded in inputs.

`WorkQueue.offer` is admission: it sheds (503) before any work when the queue is full or the
predicted wait exceeds the request's deadline; the lock is held only for list operations, so
the event loop never waits on inference.

Two kinds of request share the queue. A request of at most MAX_QUEUE_SIZE inputs is
interactive: its inputs count against MAX_QUEUE_SIZE with every other interactive input, and its
predicted wait counts only the interactive inputs ahead of it, since the batcher puts the oldest
interactive input in every batch while bulk inputs wait (`service.engine.batching.policy.
next_must`). A larger request is bulk (an indexer's chunk: up to MAX_CLIENT_BATCH_SIZE,
2,048 by default, OpenAI's limit): bulk inputs count against their own bound, the larger of
MAX_QUEUE_SIZE and MAX_CLIENT_BATCH_SIZE, so a full client batch is admitted whenever no other
bulk work holds that room; its predicted wait counts everything queued and its own tokens
(estimated from its text, `ServiceTimeEstimate.text_tokens`).

A request far heavier than the usual one (a late-chunked document, an input that
LONG_INPUTS=chunk splits: over HEAVY_REQUEST times the usual tokens an input, by the same
estimate) is charged its tokens too, and its inputs carry their tokens past the usual size
(`Item.extra_tokens`) while they wait: every later request's predicted wait counts them, so a
burst of long documents is shed at admission like a burst of short inputs, not admitted as
one usual input each and left to time out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from service import metrics
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.occupancy import Occupancy, RequestTally
from service.engine.jobs import Unit
from service.engine.types import Prepared
from service.errors import DeadlineExceeded, Overloaded

#: A request is heavy (charged its estimated tokens) past this many times the usual input's.
HEAVY_REQUEST = 4.0


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
    bulk: bool = False  # its request has more inputs than MAX_QUEUE_SIZE (set when queued)
    # Estimated tokens past the usual input's, counted in every predicted wait while it waits
    # (a heavy request's input: `WorkQueue.offer`); its parts share them.
    extra_tokens: float = 0.0

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

    def __init__(self, capacity: int, bulk_capacity: int = 0) -> None:
        self.capacity = capacity  # interactive inputs waiting (MAX_QUEUE_SIZE)
        # Bulk inputs waiting: at least one full client batch (MAX_CLIENT_BATCH_SIZE).
        self.bulk_capacity = max(capacity, bulk_capacity)
        self._new: deque[Item] = deque()
        self._depth = 0
        self._bulk_depth = 0
        self._inputs_per_request = 1.0  # moving mean over admitted requests (`room`)
        self._extra_tokens = 0.0  # the waiting items' `extra_tokens`
        self._cond = threading.Condition()
        self.occupancy = Occupancy(metrics.REQUESTS_WAITING, metrics.REQUESTS_RUNNING)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def bulk_depth(self) -> int:
        """The bulk inputs among `depth`."""
        return self._bulk_depth

    def is_bulk(self, n: int) -> bool:
        """A request of `n` inputs is bulk: more than MAX_QUEUE_SIZE."""
        return n > self.capacity

    def room(self) -> int:
        """How many more interactive requests of the usual size fit now: the free interactive
        inputs over the mean inputs of the interactive requests admitted lately (a moving
        mean, weight 1/16 a request). Read without the lock, as `refusal` is from the head."""
        free = self.capacity - (self._depth - self._bulk_depth)
        return int(free / max(1.0, self._inputs_per_request))

    def room_by(self, deadline: float, estimate: ServiceTimeEstimate) -> int:
        """`room()`, or 0 while a request of the usual size due by `deadline` (monotonic s)
        would be refused for its predicted wait (`refusal`): on a slow machine the queue can
        have free places that a deadline cannot use."""
        room = self.room()
        usual = max(1, round(self._inputs_per_request))
        if room > 0 and self.refusal(usual, deadline, estimate) is not None:
            return 0
        return room

    def refusal(
        self,
        n: int,
        deadline: float,
        estimate: ServiceTimeEstimate,
        tokens: float | None = None,
    ) -> Overloaded | None:
        """Why `n` more inputs due by `deadline` (monotonic) must be shed now, or None;
        `tokens`: their estimated tokens (None: `n` inputs of the usual size).

        Full queue (interactive or bulk, see the module docstring), or a predicted wait past
        the deadline: shedding happens before any work (TEI's `try_acquire_permit`), so a
        request that would wait past its deadline is refused now instead of expiring in the
        queue (counted when answered: `errors.shed` reasons). Called by `offer` under the
        lock, and by the admission policy from the request head (`service.admission.policy`)
        without it: a stale read there only decides one request a batch late, and `offer`
        decides again."""
        depth, bulk = self._depth, self.is_bulk(n)
        waiting = self._bulk_depth if bulk else depth - self._bulk_depth
        bound = self.bulk_capacity if bulk else self.capacity
        ahead = depth if bulk else waiting  # interactive inputs go before bulk ones
        if waiting + n > bound:
            kind = "bulk " if bulk else ""
            return Overloaded(
                f"queue full ({waiting} of {bound} {kind}inputs waiting); retry later",
                retry_after_s=estimate.predicted_wait(ahead),
                shed="queue_full",
            )
        # Shed for the deadline only behind other work: alone on an idle server a request
        # starts at once, and its batch corrects an estimate that was too pessimistic
        # (otherwise one slow cold batch could shed short deadlines forever).
        idle = depth == 0 and not estimate.running()
        own: tuple[int, float | None] | None = (n, tokens) if tokens else None
        if self._extra_tokens > 0:  # heavy inputs ahead: their tokens past the usual size
            mine = tokens if tokens else n * estimate.tokens_per_input
            own = (n, mine + self._extra_tokens)
        wait = estimate.predicted_wait(ahead + n, own=own)
        if not idle and wait > deadline - time.monotonic():
            return Overloaded(
                f"predicted wait {wait:.1f}s exceeds the request deadline; retry later",
                retry_after_s=estimate.predicted_wait(ahead),
                shed="deadline",
            )
        return None

    def offer(self, items: list[Item], estimate: ServiceTimeEstimate) -> None:
        """Queue all of `items` (one request's inputs) or none: raise `Overloaded` when full
        or too slow for them. A bulk or heavy request is charged for its tokens, estimated from
        its text; a heavy one's inputs carry their tokens past the usual size while they wait."""
        n, bulk = len(items), self.is_bulk(len(items))
        tokens: float | None = estimate.text_tokens([i.unit for i in items])
        heavy = tokens is not None and tokens > HEAVY_REQUEST * n * estimate.tokens_per_input
        if heavy and not bulk:
            for item in items:
                past = estimate.text_tokens([item.unit]) - estimate.tokens_per_input
                item.extra_tokens = max(0.0, past)
        elif not bulk:
            tokens = None  # the usual size
        with self._cond:
            refusal = self.refusal(n, min(i.deadline for i in items), estimate, tokens)
            if refusal is not None:
                raise refusal
            self._extra_tokens += sum(i.extra_tokens for i in items)
            if not bulk:
                self._inputs_per_request += (n - self._inputs_per_request) / 16
            tally = self.occupancy.admit([i.future for i in items])
            for item in items:
                item.tally, item.bulk = tally, bulk
            self._new.extend(items)
            self._depth += n
            self._bulk_depth += n if bulk else 0
            metrics.QUEUE_DEPTH.set(self._depth)
            self._cond.notify()

    def new_count(self) -> int:
        """How many inputs were handed over since the last `take_new` (a racy read: the
        loop may hand over more at any moment)."""
        return len(self._new)

    def take_new(self, timeout: float) -> list[Item]:
        """Everything handed over since the last call; block up to `timeout` s for the first."""
        with self._cond:
            if not self._new and timeout > 0:
                self._cond.wait(timeout)
            taken = list(self._new)
            self._new.clear()
            return taken

    def charge(self, n: int, *, bulk: bool = False) -> None:
        """`n` more inputs wait than were offered: an input became several parts (its windows,
        `service.engine.batching.parts`), each counted from now on (as bulk inputs too where
        the input was one)."""
        with self._cond:
            self._depth += n
            self._bulk_depth += n if bulk else 0
            metrics.QUEUE_DEPTH.set(self._depth)

    def release(self, items: Sequence[Item]) -> None:
        """`items` left the waiting set (started, answered with an error, or dropped)."""
        if not items:
            return
        with self._cond:
            self._depth -= len(items)
            self._bulk_depth -= sum(1 for i in items if i.bulk)
            extra = self._extra_tokens - sum(i.extra_tokens for i in items)
            self._extra_tokens = max(0.0, extra) if self._depth > 0 else 0.0
            metrics.QUEUE_DEPTH.set(self._depth)

    def started(self, items: list[Item]) -> None:
        """`items` (futures just marked running) are in the batch being computed now."""
        self.occupancy.start((i.tally, i.future) for i in items)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()
