"""The inference thread: loading the model, then the batch loop.

One thread owns the model. It loads and warms it up, then loops: block for the first queued
input, tokenize what arrived, form the next batch from everything waiting
(`service.engine.batching.forming`), run it and resolve each future
(`service.engine.batching.running`).

Results cross back through one `concurrent.futures.Future` per input, awaited on the loop with
`asyncio.wrap_future`; `set_running_or_notify_cancel()` tells the thread a waiter left. The
thread never touches asyncio objects, and never dies from a model error. If the loop itself
breaks, every waiter is resolved (infinity's model thread is the counter-example).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable
from enum import StrEnum

import structlog

from service import load_failure, metrics
from service.backends.onnx_backend import OnnxBackend
from service.backends.packed import warm_kernels
from service.backends.threads import fit_one_thread, threads_set
from service.backends.torch_backend import TorchBackend
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.forming import BatchFormer
from service.engine.batching.queue import WorkQueue
from service.engine.batching.running import BatchRunner
from service.engine.loading.load import load_engine
from service.engine.loading.warmup import calibrate, sample_unit, warm_up
from service.engine.types import Engine, ModelInfo
from service.errors import Draining, InferenceFailed
from service.settings import Settings

GC_YOUNG_THRESHOLD = 20_000  # allocations between young collections (Python's default: 700)

log = structlog.get_logger("service.batcher")

# The largest batch, in real tokens, whose kernels are made before ready (MAX_BATCH_TOKENS
# unset or larger): larger batches make theirs on first use, once each bucket.
MAX_WARM_TOKENS = 4096
_IDLE_WAKE_S = 0.5  # the thread wakes this often when idle, to beat its heartbeat


# Small batches timed at start on one intra-op thread against all (`fit_small_batch_threads`):
# (inputs, words) each, smallest first.
SMALL_BATCHES = ((1, 12), (1, 28), (1, 60), (2, 60), (4, 60), (8, 60))


def fit_small_batch_threads(engine: Engine, max_batch: int) -> None:
    """For each torch or onnxruntime backend serving the engine (itself, or either half of a
    routed one), the largest of `SMALL_BATCHES` that runs on one intra-op thread
    (`service.backends.threads.fit_one_thread`; onnxruntime only where its graph is small
    enough for a second session); one log line each, `small_batch_threads`."""
    backend = getattr(engine, "backend", None)
    padded = getattr(engine, "padded", None)
    if backend is None or padded is None:
        return
    batches = []
    for size, words in SMALL_BATCHES:
        words = min(words, engine.info.max_input_tokens - 4)
        unit = sample_unit(engine.info, "word " * max(1, words))
        batches.append(padded([engine.prepare(unit)] * size))
    for part in (backend, getattr(backend, "small", None), getattr(backend, "large", None)):
        if isinstance(part, TorchBackend) and str(part.device) == "cpu":
            fitted = fit_one_thread(part, batches)
            if part.one_thread_up_to:  # one thread's own kernels for the buckets it serves
                with threads_set(1):
                    fitted["shapes_warmed"] = warm_kernels(
                        part, part.one_thread_up_to, max_batch, engine.info.max_input_tokens
                    )
        elif isinstance(part, OnnxBackend):
            fitted = (
                fit_one_thread(part, batches)
                if part.one_thread_affordable()
                else {"threads": part.threads, "one_thread_up_to": 0, "why": "graph too large"}
            )
        else:
            continue
        log.info("small_batch_threads", backend=part.name, dtype=part.dtype, **fitted)


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
        self.queue = WorkQueue(settings.max_queue_size, settings.max_client_batch_size)
        self.estimate = ServiceTimeEstimate(max_batch_size=settings.max_batch_size)
        self.state = State.LOADING
        self.info: ModelInfo | None = None
        self.heartbeat = time.monotonic()
        self.drain_deadline: float | None = None  # monotonic; set on SIGTERM
        self.failure = ""  # why the state is FAILED, for /livez
        self.forming = BatchFormer(settings, self.queue, self.estimate)
        self.runner = BatchRunner(self.queue, self.estimate)
        self._engine_factory = engine_factory
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="inference", daemon=True)

    @property
    def batch_started_at(self) -> float | None:
        """When the running batch started (monotonic s), None between batches."""
        return self.runner.started_at

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
            # has work (answers, probes, sheds), and the model has the rest.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.settings.model_nice)
        try:
            engine = self._load()
        except Exception as exc:
            line = load_failure.report(self.settings.model_id, exc)  # the line, the traceback
            self._mark_failed("model failed to load")
            self.forming.fail_all(lambda: Draining("the model failed to load", retry_after_s=30))
            load_failure.record_and_exit(
                line, self.settings.load_failure_file
            )  # under gunicorn: the process ends (status 3)
            return
        try:
            while not self._stop.is_set():
                self._step(engine)
        except BaseException:  # a bug in our loop: resolve every waiter, never leave them
            log.exception("inference_thread_crashed")
            self._mark_failed("inference thread crashed")
            self.runner.fail_running(lambda: InferenceFailed("the inference thread failed"))
            raise
        finally:
            if self.state is not State.FAILED:
                self.state = State.STOPPED
            self.forming.fail_all(lambda: Draining("the server is shutting down", retry_after_s=5))

    def _mark_failed(self, why: str) -> None:
        self.failure = why  # for /livez
        self.state = State.FAILED
        metrics.READY.set(0)

    def _load(self) -> Engine:
        started = time.monotonic()
        if self.settings.model_load_delay_s:
            time.sleep(self.settings.model_load_delay_s)  # test-only: a slow load
        engine = self._engine_factory(self.settings)
        warm_up(engine)
        self._warm_kernels(engine)
        fit_small_batch_threads(engine, self.settings.max_batch_size)
        cost = calibrate(engine)
        # Move the millions of objects torch and transformers made at import and load out of
        # the collector's reach: full collections then scan only what serving allocates,
        # instead of pausing the event loop for a few hundred ms (gc.freeze, Python 3.7+).
        gc.collect()
        gc.freeze()
        # Young collections every GC_YOUNG_THRESHOLD allocations, not Python's 700: each one
        # scans only what is still alive of the requests in flight, and at 700 they ran every
        # few requests (a few percent of the event loop's CPU per request).
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        self.estimate.overhead_tokens = cost.overhead_tokens
        self.estimate.sec_per_token = cost.sec_per_token
        loaded_s = time.monotonic() - started
        self.info = engine.info
        self.forming.packed = self.runner.packed = engine.info.compute == "packed"
        self.runner.padded_up_to = engine.info.padded_up_to
        metrics.MODEL_LOAD_SECONDS.set(loaded_s)
        metrics.TORCH_THREADS.set(engine.info.torch_threads)
        log.info("model_ready", **engine.info.ready_fields(loaded_s))
        self.heartbeat = time.monotonic()
        self.state = State.READY
        if self.drain_deadline is None:
            metrics.READY.set(1)
        return engine

    def _warm_kernels(self, engine: Engine) -> None:
        """Make the packed forward's kernels for every batch shape bucket the settings allow
        (`service.backends.packed.warm_kernels`), before `/readyz` says ready."""
        backend = getattr(engine, "backend", None)
        if backend is None:
            return
        started = time.monotonic()
        limit = self.settings.max_batch_tokens or MAX_WARM_TOKENS
        shapes = warm_kernels(
            backend,
            max_tokens=min(limit, MAX_WARM_TOKENS),
            max_batch=self.settings.max_batch_size,
            max_width=engine.info.max_input_tokens,
        )
        if shapes:
            log.info("kernels_warmed", shapes=shapes, seconds=round(time.monotonic() - started, 2))

    def _step(self, engine: Engine) -> None:
        self.heartbeat = time.monotonic()
        forming = self.forming
        forming.admit(engine, self.queue.take_new(0 if forming.waiting else _IDLE_WAKE_S))
        if self.drain_deadline is not None and time.monotonic() >= self.drain_deadline:
            forming.fail_pool(lambda: Draining("drain time is over", retry_after_s=5))
            return
        batch = forming.next_batch(engine, self.runner.last)
        if batch:
            self.runner.run(engine, batch)
            forming.batch_ended()
