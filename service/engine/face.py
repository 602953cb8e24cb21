"""The engine's one face to the floors above (admission, runtime, routes): a request's refusal
or room, its offer, the probes' health and state, `/info`'s model. Nothing above the engine
reaches into the batcher (TEI's `Infer` offers `try_acquire_permit`, `embed`, `health`).

Every call is made on the event loop and returns at once: the queue's lock is held only for
list operations; the model is owned by the inference thread (`service.engine.batching`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from service.engine.batching.batcher import Batcher, State
from service.engine.batching.queue import Item
from service.engine.loading.load import load_engine
from service.engine.types import Engine, ModelInfo
from service.errors import Overloaded
from service.settings import Settings

__all__ = ["Inference", "Item", "State"]


class Inference:
    """The inference thread and its queue, seen from the event loop."""

    def __init__(
        self, settings: Settings, engine_factory: Callable[[Settings], Engine] = load_engine
    ) -> None:
        self._settings = settings
        self._batcher = Batcher(settings, engine_factory)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the inference thread: it loads the model, warms it up, then serves."""
        self._batcher.start()

    def stop(self, timeout: float) -> None:
        """Stop the thread within `timeout` seconds (blocking: call it off the loop)."""
        self._batcher.stop(timeout)

    def drain_by(self, deadline: float) -> None:
        """SIGTERM: what is queued must finish by `deadline` (monotonic s); the rest is 503."""
        self._batcher.drain_deadline = deadline

    # -- probes and /info ----------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._batcher.state

    @property
    def info(self) -> ModelInfo | None:
        """The loaded model's info; None until it is loaded."""
        return self._batcher.info

    @property
    def failure(self) -> str:
        """Why the state is FAILED ("" otherwise)."""
        return self._batcher.failure

    @property
    def queue_depth(self) -> int:
        """Inputs waiting: handed over, not yet in a running batch."""
        return self._batcher.queue.depth

    def health(self) -> tuple[bool, str]:
        """Liveness: the thread is alive, the load did not fail, no batch has run longer than
        LIVENESS_STALL_S, and once ready its heartbeat (every turn of its loop, at least every
        half second when idle) is no older than that, so a thread stuck outside any batch (in
        tokenization, on a lock) is not live either."""
        live, status = self._batcher.live()
        if not live or self._batcher.state is not State.READY:
            return live, status
        silent_s = time.monotonic() - self._batcher.heartbeat
        stall_s = self._settings.liveness_stall_s
        if self._batcher.batch_started_at is None and silent_s > stall_s:
            return False, f"no heartbeat from the inference thread for {silent_s:.1f}s"
        return live, status

    # -- admission -----------------------------------------------------------------------------
    def refusal(self, inputs: int, deadline: float) -> Overloaded | None:
        """Why `inputs` more inputs due by `deadline` (monotonic s) must be shed now, or None
        (`WorkQueue.refusal`: a full queue or a predicted wait past the deadline)."""
        return self._batcher.queue.refusal(inputs, deadline, self._batcher.estimate)

    def room_by(self, deadline: float) -> int:
        """Inputs of the usual size that could still be admitted due by `deadline`."""
        return self._batcher.queue.room_by(deadline, self._batcher.estimate)

    def is_bulk(self, inputs: int) -> bool:
        """A request of `inputs` inputs waits in the bulk room (more than MAX_QUEUE_SIZE)."""
        return self._batcher.queue.is_bulk(inputs)

    def offer(self, items: list[Item]) -> None:
        """Queue all of `items` (one request's inputs) or none; raises `Overloaded` (503)."""
        self._batcher.queue.offer(items, self._batcher.estimate)
