"""The inference thread: loading, batch formation, running batches, resolving futures.

One thread owns the model. It loads and warms it up, then loops: block for the first queued
input, tokenize what arrived, pick the next batch from everything waiting (padding-aware, one
parameter set, at most MAX_BATCH_SIZE: `service.engine.batching.policy`), wait at most
MAX_BATCH_WAIT_MS
from when the batch starts forming (default 0: an idle server starts at once), drop what was
cancelled or expired, run the pipeline once, and resolve each future.

Results cross back through one `concurrent.futures.Future` per input, awaited on the loop with
`asyncio.wrap_future`; `set_running_or_notify_cancel()` tells the thread a waiter left. The
thread never touches asyncio objects, and never dies from a model error: a failing batch is
split so that only the failing input gets the error. If the loop itself breaks, every waiter
is resolved (infinity's model thread is the counter-example).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from enum import StrEnum
from typing import Any

import structlog

from service import metrics
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.policy import MAX_PASSES, best_run
from service.engine.batching.queue import Item, WorkQueue
from service.engine.jobs import NO_FORWARD
from service.engine.loading import load_engine
from service.engine.types import Engine, ModelInfo, prepare_each
from service.engine.warmup import calibrate, warm_up
from service.errors import (
    DeadlineExceeded,
    Draining,
    InferenceFailed,
    ServiceError,
)
from service.log import event_line
from service.settings import Settings

log = structlog.get_logger("service.batcher")

_IDLE_WAKE_S = 0.5  # the thread wakes this often when idle, to beat its heartbeat
# Waiting for answered clients' next requests (`_await_answered_clients`): arrivals that pause
# this long end the wait; it never lasts more than this share of the last batch's run time.
_QUIET_S = 0.003
_FILL_SHARE = 0.25


class State(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class Batcher:
    """Owns the inference thread, its state (for the probes) and the queue."""

    def __init__(
        self, settings: Settings, engine_factory: Callable[[Settings], Engine] = load_engine
    ) -> None:
        self.settings = settings
        self.queue = WorkQueue(settings.max_queue_size)
        self.estimate = ServiceTimeEstimate(max_batch_size=settings.max_batch_size)
        self.state = State.LOADING
        self.info: ModelInfo | None = None
        self.heartbeat = time.monotonic()
        self.batch_started_at: float | None = None
        self.drain_deadline: float | None = None  # monotonic; set on SIGTERM
        self._engine_factory = engine_factory
        self._stop = threading.Event()
        self._pool: list[Item] = []  # prepared, waiting for a batch; thread-only
        self._running: list[Item] = []  # the batch in the pipeline now; thread-only
        self.failure = ""  # why the state is FAILED, for /livez
        self._last_batch_s = 0.0
        self._last_batch_size = 0
        self._thread = threading.Thread(target=self._main, name="inference", daemon=True)

    # -- control (event loop) ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop after the running batch; every waiter still queued gets a 503."""
        self._stop.set()
        self.queue.wake()
        self._thread.join(timeout)

    def live(self) -> tuple[bool, str]:
        """Liveness: the thread runs (loading counts) and no batch runs past LIVENESS_STALL_S."""
        if self.state is State.FAILED:
            return False, self.failure
        if not self._thread.is_alive() and self.state is not State.STOPPED:
            return False, "inference thread is not running"
        started = self.batch_started_at
        if started is not None and time.monotonic() - started > self.settings.liveness_stall_s:
            return False, f"a batch has run longer than {self.settings.liveness_stall_s:g}s"
        return True, self.state.value

    # -- the thread ----------------------------------------------------------------------
    def _main(self) -> None:
        if self.settings.model_nice:
            # Before the load: torch's OpenMP threads, made by this thread at its first
            # parallel op, inherit its nice value. The event loop then wins the CPU whenever it
            # has work (answers, probes, sheds), and the model has the rest (README, Overload).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.settings.model_nice)
        try:
            engine = self._load()
        except Exception:
            log.exception("model_load_failed")
            self._mark_failed("model failed to load")
            self._fail_all(lambda: Draining("the model failed to load", retry_after_s=30))
            return
        try:
            while not self._stop.is_set():
                self._step(engine)
        except BaseException:  # a bug in our loop: resolve every waiter, never leave them
            log.exception("inference_thread_crashed")
            self._mark_failed("inference thread crashed")
            for item in self._running:  # already marked running: only we can answer them
                _fail(item, InferenceFailed("the inference thread failed"))
            raise
        finally:
            if self.state is not State.FAILED:
                self.state = State.STOPPED
            self._fail_all(lambda: Draining("the server is shutting down", retry_after_s=5))

    def _mark_failed(self, why: str) -> None:
        self.failure = why  # for /livez
        self.state = State.FAILED
        metrics.READY.set(0)

    def _load(self) -> Engine:
        started = time.monotonic()
        if self.settings.model_load_delay_s:
            time.sleep(self.settings.model_load_delay_s)  # test-only: a slow load
        engine = self._engine_factory(self.settings)
        warm_s = warm_up(engine)
        cost = calibrate(engine)
        # Move the millions of objects torch and transformers made at import and load out of
        # the collector's reach: full collections then scan only what serving allocates,
        # instead of pausing the event loop for a few hundred ms (gc.freeze, Python 3.7+).
        gc.collect()
        gc.freeze()
        self.estimate.overhead_tokens = cost.overhead_tokens
        self.estimate.sec_per_token = cost.sec_per_token
        loaded_s = time.monotonic() - started
        self.info = engine.info
        metrics.MODEL_LOAD_SECONDS.set(loaded_s)
        metrics.TORCH_THREADS.set(engine.info.torch_threads)
        log.info(
            "model_ready",
            load_s=round(loaded_s, 3),
            warmup_s=round(warm_s, 4),
            overhead_tokens=round(cost.overhead_tokens, 1),
            **engine.info.summary(),
        )
        self.heartbeat = time.monotonic()
        self.state = State.READY
        if self.drain_deadline is None:
            metrics.READY.set(1)
        return engine

    def _step(self, engine: Engine) -> None:
        self.heartbeat = time.monotonic()
        self._admit_to_pool(engine, self.queue.take_new(0 if self._pool else _IDLE_WAKE_S))
        if self._drain_expired():
            self._fail_pool(lambda: Draining("drain time is over", retry_after_s=5))
            return
        if not self._pool:
            return
        self._await_answered_clients(engine)
        self._drop_doomed()
        if not self._pool:
            return
        batch = self._fill(engine, self._select())
        self._run(engine, batch)

    def _await_answered_clients(self, engine: Engine) -> None:
        """After a batch, wait briefly for the next requests of the clients it just answered
        (a closed loop sends them as soon as the event loop has written their answers), up to
        a pool of what is queued now plus that batch's size. Without this, what arrived while
        the batch ran goes alone while the answered clients' requests queue behind it, and the
        clients split into groups that alternate: measured at 8 clients, batches of 4, 4,
        4, ... (two fixed costs where one would do), and pairs like 31 + 1 at 32 clients.

        Waiting pays while arrivals come fast enough: with a batch's fixed cost `a` seconds
        (the calibrated overhead, `ServiceTimeEstimate`) and arrivals at `r` per second, a
        pool of `n` inputs gains throughput by waiting as long as `r * a > n` (the derivative
        of n / (a + b n) over a wait that adds r inputs a second). So the wait ends when the
        pool reaches its target, arrivals pause for `_QUIET_S`, their rate no longer pays
        (`r * a <= n`), or `_FILL_SHARE` of that batch's run time has passed. The model
        waits, but on cores the event loop shares, the loop meanwhile answers and reads at
        full speed instead of competing with the forward."""
        size = self._last_batch_size
        target = min(self.settings.max_batch_size, len(self._pool) + size)
        if size < 2 or len(self._pool) >= target:
            return
        fixed_s = self.estimate.overhead_tokens * self.estimate.sec_per_token
        until = time.monotonic() + _FILL_SHARE * self._last_batch_s
        first_at, since_first = 0.0, 0  # the rate counts from the first arrival: before it,
        while len(self._pool) < target:  # the loop was writing the batch's answers
            left = until - time.monotonic()
            arrived = self.queue.take_new(min(left, _QUIET_S)) if left > 0 else []
            if not arrived:
                return
            self._admit_to_pool(engine, arrived)
            now = time.monotonic()
            if not first_at:
                first_at, since_first = now, len(arrived) - 1
                continue
            since_first += len(arrived)
            if since_first / max(now - first_at, 1e-4) * fixed_s <= len(self._pool):
                return

    def _drop_doomed(self) -> None:
        """Under load, answer 504 now for inputs whose deadline passes before a batch could
        end (the last batch's run time from now): computing them would spend the model on
        answers nobody reads while others wait. The pool is never emptied this way: the input
        with the latest deadline stays and runs, so a batch always runs and the last batch's
        run time keeps following the load. (Without that, one 2.3 s batch under a storm with
        a 2 s deadline doomed every input after it: no batch ran again and nothing updated
        that time, a server stuck answering 504.) Alone in the pool an input always runs."""
        if len(self._pool) < 2 or not self._last_batch_s:
            return
        ends = time.monotonic() + self._last_batch_s
        doomed = [i for i in self._pool if i.deadline < ends]
        if not doomed:
            return
        if len(doomed) == len(self._pool):
            doomed.remove(max(doomed, key=lambda i: i.deadline))
        gone = set(map(id, doomed))
        self._pool = [i for i in self._pool if id(i) not in gone]
        for item in doomed:
            metrics.EXPIRED.labels("queued").inc()
            _fail(item, DeadlineExceeded("the request deadline passes before its batch could end"))
        self.queue.release(len(doomed))

    def _admit_to_pool(self, engine: Engine, items: list[Item]) -> None:
        """Drop the cancelled and expired, tokenize the rest (exact length checks; one
        `prepare_many` call for all that arrived) into the pool."""
        live = [item for item in items if not self._dropped(item)]
        gone = len(items) - len(live)
        units = [item.unit for item in live]
        try:
            prepared = engine.prepare_many(units) if units else []
        except Exception:  # never the thread's end: each alone, so only the failing one errs
            log.exception("prepare_many_failed", inputs=len(units))
            prepared = prepare_each(engine.prepare, units)
        for item, result in zip(live, prepared, strict=True):
            if isinstance(result, ServiceError):
                _fail(item, result)
                gone += 1
                continue
            if isinstance(result, Exception):
                log.error("prepare_failed", exc_info=result)
                _fail(item, InferenceFailed("the model failed on this input"))
                gone += 1
                continue
            item.prepared = result
            if item.unit.op in NO_FORWARD:  # tokenize, decode: answered without a batch
                if item.future.set_running_or_notify_cancel():
                    item.future.set_result(result.answer)
                gone += 1
                continue
            self._pool.append(item)
        if gone:
            self.queue.release(gone)

    def _select(self) -> list[Item]:
        """The next batch from the pool: padding-aware (see `service.engine.batching.policy`),
        including
        any input that has waited too long or whose deadline is near. Units of every op and
        parameter set share batches: parameters only change each unit's own tokenization and
        answer, never the forward."""
        now = time.monotonic()
        urgent_s = 4 * self._last_batch_s
        forced = [
            i for i in self._pool if i.passed_over >= MAX_PASSES or i.deadline - now < urgent_s
        ]
        must = min(forced, key=lambda i: (i.deadline, i.enqueued_at)) if forced else None
        group = sorted(self._pool, key=_tokens)
        start, stop = best_run(
            [_tokens(i) for i in group],
            must=group.index(must) if must is not None else None,
            max_size=self.settings.max_batch_size,
            max_tokens=self.settings.max_batch_tokens,
            overhead_tokens=self.estimate.overhead_tokens,
        )
        return sorted(group[start:stop], key=lambda i: i.enqueued_at)

    def _fill(self, engine: Engine, batch: list[Item]) -> list[Item]:
        """Wait up to MAX_BATCH_WAIT_MS, once per batch from when it starts forming, for more
        items (one deadline per batch, never reset per item)."""
        wait_s = self.settings.max_batch_wait_ms / 1000
        if wait_s <= 0 or len(batch) >= self.settings.max_batch_size:
            return batch
        started = time.monotonic()
        until = started + wait_s
        while len(batch) < self.settings.max_batch_size and time.monotonic() < until:
            self._admit_to_pool(engine, self.queue.take_new(until - time.monotonic()))
            batch = self._select()
        metrics.BATCH_FILL_WAIT.observe(time.monotonic() - started)
        return batch

    def _run(self, engine: Engine, batch: list[Item]) -> None:
        chosen = set(map(id, batch))
        self._pool = [i for i in self._pool if id(i) not in chosen]
        for item in self._pool:
            item.passed_over += 1
        self.queue.release(len(batch))
        live = [
            i for i in batch if not self._dropped(i) and i.future.set_running_or_notify_cancel()
        ]
        if not live:
            return
        self.queue.started(live)  # their requests run (`service.engine.batching.occupancy`)
        now = time.monotonic()
        for item in live:
            metrics.QUEUE_WAIT.observe(now - item.enqueued_at)
        self.batch_started_at = now
        padded = len(live) * max(map(_tokens, live))
        self.estimate.batch_started(padded)
        self._running = live  # kept if a BaseException escapes: _main answers them
        try:
            answers = self._answers(engine, live)
        finally:
            self.batch_started_at = None
            self.estimate.batch_finished()
        self._running = []
        took = time.monotonic() - now
        self._last_batch_s, self._last_batch_size = took, len(live)
        self.estimate.observe(took, len(live), padded)
        # Metrics and the batch's log line first: once the futures resolve, the event loop
        # wants the GIL to answer, and this thread holding it (and the log handler's lock)
        # meanwhile delayed every answer by ~0.45 ms at one client (README, Benchmarks).
        self._observe(live, now, took, padded)
        for item, answer in zip(live, answers, strict=True):
            if isinstance(answer, BaseException):
                item.future.set_exception(answer)
            else:
                item.future.set_result(answer)

    def _answers(self, engine: Engine, live: list[Item]) -> list[Any]:
        """The batch's answers; if the batch call raises, each input alone, so only the
        failing input(s) get an error."""
        prepared = [i.prepared for i in live if i.prepared is not None]
        try:
            return engine.run(prepared)
        except Exception:
            if len(live) == 1:
                log.exception("inference_failed", batch_size=1)
                return [InferenceFailed("the model failed on this input")]
        log.warning("batch_failed_splitting", batch_size=len(live))
        return [self._answers(engine, [item])[0] for item in live]

    def _observe(self, live: list[Item], started: float, took: float, padded: int) -> None:
        tokens = [_tokens(i) for i in live]
        metrics.BATCH_SIZE.observe(len(live))
        metrics.BATCH_TOKENS.observe(padded)
        metrics.PADDING_EFFICIENCY.observe(sum(tokens) / padded)
        metrics.INFERENCE_SECONDS.observe(took)
        metrics.INPUTS.labels("answered").inc(len(live))
        fields = {
            "size": len(live),
            "tokens": sum(tokens),
            "padded_tokens": padded,
            "queue_wait_ms": round(1000 * (started - min(i.enqueued_at for i in live)), 2),
            "inference_ms": round(1000 * took, 2),
            "queue_depth": self.queue.depth,
        }
        event_line("service.batcher", "batch", fields)

    # -- dropping and failing ------------------------------------------------------------
    def _dropped(self, item: Item) -> bool:
        """True when the item must not be computed: its waiter left, or its deadline passed."""
        if item.future.cancelled():
            if item.cancel_reason == "deadline":
                metrics.EXPIRED.labels("queued").inc()
            else:
                metrics.CANCELLED.labels(item.cancel_reason).inc()
            return True
        if time.monotonic() >= item.deadline:
            metrics.EXPIRED.labels("queued").inc()
            _fail(item, DeadlineExceeded("the request deadline passed in the queue"))
            return True
        return False

    def _drain_expired(self) -> bool:
        return self.drain_deadline is not None and time.monotonic() >= self.drain_deadline

    def _fail_pool(self, error: Any) -> None:
        pool, self._pool = self._pool, []
        for item in pool:
            _fail(item, error())
        self.queue.release(len(pool))

    def _fail_all(self, error: Any) -> None:
        """Fail the pool and everything still queued (not yet tokenized) alike."""
        self._pool.extend(self.queue.take_new(0))
        self._fail_pool(error)


def _fail(item: Item, error: BaseException) -> None:
    """Answer `item` with `error`, unless it is already settled: the event loop cancels a
    queued input whenever its request ends (a sibling input failed, the deadline passed, the
    client left), and that can happen between any check here and this call."""
    with contextlib.suppress(InvalidStateError):
        item.future.set_exception(error)


def _tokens(item: Item) -> int:
    return item.prepared.n_tokens if item.prepared is not None else 0
