"""The service-time estimate behind deadline-aware shedding and `Retry-After`.

The cost model is the one the batch selector uses (`service.engine.batching.policy`): a batch
takes `sec_per_token x (overhead_tokens + computed tokens)`, where the computed tokens are what
the forward computes (`policy.computed_tokens`: n inputs padded to L tokens compute n x L, a
packed batch only its real tokens). `sec_per_token` and the computed tokens per input are
exponentially weighted moving averages over every batch run, so the estimate follows the
lengths and batch sizes the load actually forms (a per-input average fed by single-input
batches would overstate the cost of a burst that runs in full batches).

With Q inputs queued, draining them takes about `ceil(Q / B)` batches of overhead plus
`Q x tokens_per_input` computed tokens, plus what is left of the running batch: Little's law on
a single server (Kleinrock, *Queueing Systems*, vol. 1) with a batch-aware service time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

# Weight of the newest batch: ~10 batches of memory, fast enough to follow a change of load.
_ALPHA = 0.2


@dataclass
class ServiceTimeEstimate:
    """Batch cost model, written by the inference thread and read by the event loop: each
    field is one float, and a stale read only makes one admission decision one batch late.

    Units: seconds per computed token; tokens; `batch_ends_at` is `time.monotonic()` seconds
    (0 when no batch runs).
    """

    sec_per_token: float = 1e-4
    overhead_tokens: float = 64.0
    tokens_per_input: float = 64.0
    max_batch_size: int = 32
    batch_ends_at: float = 0.0

    def batch_seconds(self, tokens: float) -> float:
        return self.sec_per_token * (self.overhead_tokens + tokens)

    def observe(self, seconds: float, inputs: int, tokens: int) -> None:
        """Fold in one finished batch of `inputs` inputs, `tokens` computed tokens in all,
        `seconds` long."""
        sample = seconds / (self.overhead_tokens + tokens)
        self.sec_per_token += _ALPHA * (sample - self.sec_per_token)
        per_input = tokens / max(1, inputs)
        self.tokens_per_input += _ALPHA * (per_input - self.tokens_per_input)

    def batch_started(self, tokens: int) -> None:
        self.batch_ends_at = time.monotonic() + self.batch_seconds(tokens)

    def batch_finished(self) -> None:
        self.batch_ends_at = 0.0

    def running(self) -> bool:
        """A batch is running (as far as the thread's last update says)."""
        return self.batch_ends_at > 0.0

    def predicted_wait(self, queued_inputs: int) -> float:
        """Seconds until `queued_inputs` inputs (those ahead plus one's own) are answered."""
        running = max(0.0, self.batch_ends_at - time.monotonic()) if self.running() else 0.0
        if queued_inputs <= 0:
            return running
        batches = math.ceil(queued_inputs / self.max_batch_size)
        queued = self.sec_per_token * (
            batches * self.overhead_tokens + queued_inputs * self.tokens_per_input
        )
        return running + queued
