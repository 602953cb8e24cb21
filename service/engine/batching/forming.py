"""Forming the next batch: the inputs tokenized and waiting (the pool), and which of them run
together next. Inference thread only.

Arrivals from the queue are tokenized into the pool (`admit`). Before each batch the pool
waits briefly for the clients the last batch answered (`await_answered_clients`), answers 504
for inputs that cannot finish in time (`drop_doomed`), and the batch is chosen padding-aware
(`select`: `service.engine.batching.policy`) and filled for up to MAX_BATCH_WAIT_MS (`fill`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from service import metrics
from service.engine.batching import parts
from service.engine.batching.backlog import Backlog
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.policy import (
    BULK_WINDOW,
    IDLE_SLICES,
    INTERACTIVE_RECENT_S,
    bulk_slice_tokens,
    next_batch,
    next_must,
)
from service.engine.batching.queue import Item, WorkQueue
from service.engine.batching.running import LastBatch
from service.engine.jobs import NO_FORWARD
from service.engine.types import Engine, prepare_each
from service.errors import DeadlineExceeded, InferenceFailed, ServiceError
from service.settings import Settings

log = structlog.get_logger("service.batcher")

# Waiting for answered clients' next requests (`await_answered_clients`): arrivals that pause
# this long end the wait; it never lasts more than this share of the last batch's run time.
_QUIET_S = 0.003
_FILL_SHARE = 0.25


class BatchFormer:
    """The pool of prepared inputs waiting for a batch, and the next batch formed from it."""

    def __init__(self, settings: Settings, queue: WorkQueue, estimate: ServiceTimeEstimate) -> None:
        self.settings = settings
        self.queue = queue
        self.estimate = estimate
        self.pool: list[Item] = []  # prepared, in arrival order
        self.backlog = Backlog()  # bulk inputs not tokenized yet (`backlog`)
        self.packed = False  # the forward computes real tokens only (`ModelInfo.compute`)
        self.interactive_at = float("-inf")  # when an interactive input last arrived (monotonic)
        self.waiting_at_end = 0  # inputs waiting when the last batch ended (`batch_ended`)

    @property
    def waiting(self) -> bool:
        """Inputs wait for a batch: pooled, or bulk ones held untokenized."""
        return bool(self.pool) or bool(self.backlog)

    def admit(self, engine: Engine, items: list[Item]) -> None:
        """Drop the cancelled and expired, tokenize the rest (exact length checks; one
        `prepare_many` call for all that arrived) into the pool; tokenize and decode are
        answered here (no forward); an input made into parts (a long input's windows) enters
        as its parts (`service.engine.batching.parts`). Bulk inputs wait in the backlog and
        join at most one batch's worth a call (`service.engine.batching.backlog`)."""
        if any(not item.bulk for item in items):
            self.interactive_at = time.monotonic()
        size = self.settings.max_batch_size
        pooled = sum(1 for i in self.pool if i.bulk)
        items = self.backlog.hold(items) + self.backlog.next(pooled, BULK_WINDOW * size, size)
        live: list[Item] = []
        gone: list[Item] = []
        for item in items:
            (gone if item.dropped() else live).append(item)
        units = [item.unit for item in live]
        try:
            prepared = engine.prepare_many(units) if units else []
        except Exception:  # never the thread's end: each alone, so only the failing one errs
            log.exception("prepare_many_failed", inputs=len(units))
            prepared = prepare_each(engine.prepare, units)
        for item, result in zip(live, prepared, strict=True):
            if isinstance(result, ServiceError):
                item.fail(result)
                gone.append(item)
                continue
            if isinstance(result, Exception):
                log.error("prepare_failed", exc_info=result)
                item.fail(InferenceFailed("the model failed on this input"))
                gone.append(item)
                continue
            item.prepared = result
            if result.parts:  # a long input's windows: each batched as an input
                self.pool.extend(parts.expand(item, result, self.queue))
                continue
            if item.unit.op in NO_FORWARD:
                if item.future.set_running_or_notify_cancel():
                    item.future.set_result(result.answer)
                gone.append(item)
                continue
            self.pool.append(item)
        # What admission charges a bulk request: the characters per token of these texts.
        self.estimate.observe_units((i.unit, i.prepared.n_tokens) for i in live if i.prepared)
        self.queue.release(gone)

    def next_batch(self, engine: Engine, last: LastBatch) -> list[Item]:
        """The inputs to run now, taken out of the pool (empty when none is left to run)."""
        if not self.pool:
            self.admit(engine, [])  # bulk inputs from the backlog, if any
        if not self.pool:
            return []
        self.await_answered_clients(engine, last)
        self.drop_doomed(last.seconds)
        if not self.pool:
            return []
        batch = self.fill(engine, self.select(last.seconds), last.seconds)
        self.take(batch)
        return batch

    def batch_ended(self) -> None:
        """A batch was answered: count what waits for the next one (pooled or handed over),
        the pool `await_answered_clients` fills up from."""
        self.waiting_at_end = len(self.pool) + self.queue.new_count()

    def await_answered_clients(self, engine: Engine, last: LastBatch) -> None:
        """After a batch, wait briefly for the next requests of the clients it answered (a
        closed loop sends them as soon as the event loop has written their answers), up to a
        pool of what was waiting when that batch ended plus that batch's size (counted then:
        by now the pool may hold some of those clients' requests already, and counting them
        twice would wait for clients that do not exist). Without this, what arrived while
        the batch ran goes alone while the answered clients' requests queue behind it, and
        the clients split into groups that alternate (two fixed costs where one would do).

        Waiting pays while arrivals come fast enough: with a batch's fixed cost `a` seconds
        (the calibrated overhead, `ServiceTimeEstimate`) and arrivals at `r` per second, a
        pool of `n` inputs gains throughput by waiting as long as `r * a > n` (the derivative
        of n / (a + b n) over a wait that adds r inputs a second). So the wait ends when the
        pool reaches its target, arrivals pause for `_QUIET_S`, their rate no longer pays
        (`r * a <= n`), or `_FILL_SHARE` of that batch's run time has passed."""
        target = min(self.settings.max_batch_size, self.waiting_at_end + last.size)
        if last.size < 2 or len(self.pool) >= target:
            return
        fixed_s = self.estimate.overhead_tokens * self.estimate.sec_per_token
        until = time.monotonic() + _FILL_SHARE * last.seconds
        first_at, since_first = 0.0, 0  # the rate counts from the first arrival: before it,
        while len(self.pool) < target:  # the loop was writing the batch's answers
            left = until - time.monotonic()
            arrived = self.queue.take_new(min(left, _QUIET_S)) if left > 0 else []
            if not arrived:
                return
            self.admit(engine, arrived)
            now = time.monotonic()
            if not first_at:
                first_at, since_first = now, len(arrived) - 1
                continue
            since_first += len(arrived)
            if since_first / max(now - first_at, 1e-4) * fixed_s <= len(self.pool):
                return

    def drop_doomed(self, last_s: float) -> None:
        """Answer 504 now for inputs whose deadline passes before a batch could end (`last_s`,
        the last batch's run time, from now): computing them would spend the model on answers
        nobody reads. The pool is never emptied this way: the input with the latest deadline
        stays and runs, so a batch always runs and the last batch's run time keeps following
        the load (else one slow batch could doom every input after it, and no batch would run
        again to correct that time). Alone in the pool an input always runs."""
        if len(self.pool) < 2 or not last_s:
            return
        doomed = _doomed(self.pool, time.monotonic() + last_s)
        if not doomed:
            return
        gone = set(map(id, doomed))
        self.pool = [i for i in self.pool if id(i) not in gone]
        for item in doomed:
            metrics.EXPIRED.labels("queued").inc()
            item.fail(DeadlineExceeded("the request deadline passes before its batch could end"))
        self.queue.release(doomed)

    def select(self, last_s: float) -> list[Item]:
        """The next batch from the pool (`service.engine.batching.policy`: padding-aware, or
        the oldest input and those nearest it in length when the forward is packed), with any
        input passed over MAX_PASSES times or whose deadline is within 4 x `last_s`, and while
        bulk inputs wait, the oldest interactive one (`next_must`); while interactive traffic
        is recent, interactive inputs alone or a slice of bulk inputs, else at most
        IDLE_SLICES slices (`policy.bulk_slice`). Units of every op and parameter set share
        batches: parameters only change each unit's own tokenization and answer, never the
        forward."""
        now = time.monotonic()
        recent = now - self.interactive_at < INTERACTIVE_RECENT_S
        candidates, must = next_must(
            self.pool,
            now=now,
            urgent_s=4 * last_s,
            max_size=self.settings.max_batch_size,
            bulk_tokens=_bulk_tokens(self.settings, self.estimate, recent=recent),
            packed=self.packed,
        )
        picked = next_batch(
            [i.tokens for i in candidates],
            must=candidates.index(must) if must is not None else None,
            max_size=self.settings.max_batch_size,
            max_tokens=self.settings.max_batch_tokens,
            overhead_tokens=self.estimate.overhead_tokens,
            packed=self.packed,
        )
        return sorted((candidates[k] for k in picked), key=lambda i: i.enqueued_at)

    def fill(self, engine: Engine, batch: list[Item], last_s: float) -> list[Item]:
        """Wait up to MAX_BATCH_WAIT_MS, once per batch from when it starts forming, for more
        inputs (one deadline per batch, never reset per input)."""
        wait_s = self.settings.max_batch_wait_ms / 1000
        if wait_s <= 0 or len(batch) >= self.settings.max_batch_size:
            return batch
        started = time.monotonic()
        until = started + wait_s
        while len(batch) < self.settings.max_batch_size and time.monotonic() < until:
            self.admit(engine, self.queue.take_new(until - time.monotonic()))
            batch = self.select(last_s)
        metrics.BATCH_FILL_WAIT.observe(time.monotonic() - started)
        return batch

    def take(self, batch: list[Item]) -> None:
        """Take `batch` out of the pool (they leave the queue's depth); the inputs left behind
        were passed over once more."""
        chosen = set(map(id, batch))
        self.pool = [i for i in self.pool if id(i) not in chosen]
        for item in self.pool:
            item.passed_over += 1
        self.queue.release(batch)

    def fail_pool(self, error: Callable[[], BaseException]) -> None:
        """Answer every pooled input, and every one in the backlog, with a new `error()`."""
        pool, self.pool = self.pool + self.backlog.drain(), []
        for item in pool:
            item.fail(error())
        self.queue.release(pool)

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Answer the pool, the backlog and everything still queued alike."""
        self.pool.extend(self.queue.take_new(0))
        self.fail_pool(error)


def _doomed(pool: list[Item], ends: float) -> list[Item]:
    """The inputs of `pool` whose deadline passes before `ends` (monotonic s), less the one
    with the latest deadline where that is all of them."""
    doomed = [i for i in pool if i.deadline < ends]
    if doomed and len(doomed) == len(pool):
        doomed.remove(max(doomed, key=lambda i: i.deadline))
    return doomed


def _bulk_tokens(settings: Settings, estimate: ServiceTimeEstimate, *, recent: bool) -> int | None:
    """The computed tokens of bulk inputs a batch may hold: one slice of BULK_SLICE_MS while
    interactive traffic is `recent`, IDLE_SLICES slices otherwise, None when slicing is off
    (`policy.bulk_slice_tokens`)."""
    if not settings.bulk_slice_ms:
        return None
    slice_s = settings.bulk_slice_ms / 1000 * (1 if recent else IDLE_SLICES)
    return bulk_slice_tokens(
        slice_s=slice_s,
        sec_per_token=estimate.sec_per_token,
        overhead_tokens=estimate.overhead_tokens,
    )
