"""Running one batch: mark its inputs running, compute their answers, count, resolve.

A failing batch is split so that only the failing input gets the error; the thread never dies
from a model error. Inference thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from service import metrics
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.policy import computed_tokens
from service.engine.batching.queue import Item, WorkQueue
from service.engine.types import Engine
from service.errors import InferenceFailed
from service.log import event_line

log = structlog.get_logger("service.batcher")


@dataclass
class LastBatch:
    """The last batch that ran: its inputs and its run time in seconds (0: none yet)."""

    size: int = 0
    seconds: float = 0.0


class BatchRunner:
    """Runs batches on an engine and keeps what the rest of the thread reads about them:
    `started_at` (monotonic s, None between batches: for liveness), `last`, and `running`
    (the batch's inputs while it runs: if the thread breaks, only it can answer them)."""

    def __init__(self, queue: WorkQueue, estimate: ServiceTimeEstimate) -> None:
        self.queue = queue
        self.estimate = estimate
        self.last = LastBatch()
        self.started_at: float | None = None
        self.running: list[Item] = []
        self.packed = False  # the forward computes real tokens only (`ModelInfo.compute`)
        self.padded_up_to = 0  # ... except batches this small (`ModelInfo.padded_up_to`)

    def run(self, engine: Engine, batch: list[Item]) -> None:
        """Compute `batch` (already out of the pool) and resolve each input's future; inputs
        whose waiter left or whose deadline passed are skipped."""
        live = [i for i in batch if not i.dropped() and i.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.queue.started(live)  # their requests run (`service.engine.batching.occupancy`)
        now = time.monotonic()
        for item in live:
            metrics.QUEUE_WAIT.observe(now - item.enqueued_at)
        self.started_at = now
        tokens = [i.tokens for i in live]
        padded = computed_tokens(tokens, packed=False)
        computed = computed_tokens(tokens, packed=self.packed and padded > self.padded_up_to)
        self.estimate.batch_started(computed)
        self.running = live
        try:
            answers = self._answers(engine, live)
        finally:
            self.started_at = None
            self.estimate.batch_finished()
        self.running = []
        took = time.monotonic() - now
        self.last = LastBatch(size=len(live), seconds=took)
        self.estimate.observe(took, len(live), computed)
        # Metrics and the batch's log line first: once the futures resolve, the event loop
        # wants the GIL to answer, and this thread holding it (and the log handler's lock)
        # meanwhile would delay every answer.
        self._observe(live, now, took, computed)
        for item, answer in zip(live, answers, strict=True):
            if isinstance(answer, BaseException):
                item.future.set_exception(answer)
            else:
                item.future.set_result(answer)

    def fail_running(self, error: Callable[[], BaseException]) -> None:
        """Answer the inputs of the batch that was running with a new `error()` each (they
        are marked running: only this thread can answer them)."""
        running, self.running = self.running, []
        for item in running:
            item.fail(error())

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

    def _observe(self, live: list[Item], started: float, took: float, computed: int) -> None:
        tokens = [i.tokens for i in live]
        padded = computed_tokens(tokens, packed=False)  # the batch's shape, B x L
        metrics.BATCH_SIZE.observe(len(live))
        metrics.BATCH_TOKENS.observe(padded)
        metrics.BATCH_COMPUTED_TOKENS.observe(computed)
        metrics.PADDING_EFFICIENCY.observe(sum(tokens) / max(computed, 1))
        metrics.INFERENCE_SECONDS.observe(took)
        metrics.INPUTS.labels("answered").inc(len(live))
        fields = {
            "size": len(live),
            "bulk": sum(1 for i in live if i.bulk),  # inputs of bulk requests among them
            "tokens": sum(tokens),
            "padded_tokens": padded,
            "computed_tokens": computed,
            "queue_wait_ms": round(1000 * (started - min(i.enqueued_at for i in live)), 2),
            "inference_ms": round(1000 * took, 2),
            "queue_depth": self.queue.depth,
        }
        event_line("service.batcher", "batch", fields)
