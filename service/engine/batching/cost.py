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
a single server (Kleinrock, *Queueing Systems*, vol. 1) with a batch-aware service time. A
bulk request is charged for its own tokens instead of the usual size: its text's characters
over `chars_per_token`, a moving average of what the tokenizer made of the texts it was given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service.engine.jobs import Unit

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
    chars_per_token: float = 4.0  # text characters per token, special tokens included

    def batch_seconds(self, tokens: float) -> float:
        return self.sec_per_token * (self.overhead_tokens + tokens)

    def observe(self, seconds: float, inputs: int, tokens: int) -> None:
        """Fold in one finished batch of `inputs` inputs, `tokens` computed tokens in all,
        `seconds` long."""
        sample = seconds / (self.overhead_tokens + tokens)
        self.sec_per_token += _ALPHA * (sample - self.sec_per_token)
        per_input = tokens / max(1, inputs)
        self.tokens_per_input += _ALPHA * (per_input - self.tokens_per_input)

    def observe_text(self, chars: int, tokens: int) -> None:
        """Fold in texts of `chars` characters that tokenized to `tokens` tokens."""
        if chars > 0 and tokens > 0:
            self.chars_per_token += _ALPHA * (chars / tokens - self.chars_per_token)

    def observe_units(self, tokenized: Iterable[tuple[Unit, int]]) -> None:
        """Fold in units just tokenized, each with its token count (text units only)."""
        texts = [(u, n) for u, n in tokenized if u.text is not None]
        chars = sum(len(u.text or "") + len(u.pair or "") for u, _ in texts)
        self.observe_text(chars, sum(n for _, n in texts))

    def text_tokens(self, units: Sequence[Unit]) -> float:
        """The tokens `units` will take, estimated on the event loop: token ids counted, text
        (and text pairs) at `chars_per_token`."""
        chars = sum(len(u.text or "") + len(u.pair or "") for u in units)
        ids = sum(len(u.ids) for u in units if u.ids is not None)
        return ids + chars / max(self.chars_per_token, 1e-3)

    def batch_started(self, tokens: int) -> None:
        self.batch_ends_at = time.monotonic() + self.batch_seconds(tokens)

    def batch_finished(self) -> None:
        self.batch_ends_at = 0.0

    def running(self) -> bool:
        """A batch is running (as far as the thread's last update says)."""
        return self.batch_ends_at > 0.0

    def predicted_wait(
        self, queued_inputs: int, own: tuple[int, float | None] | None = None
    ) -> float:
        """Seconds until `queued_inputs` inputs (those ahead plus one's own) are answered;
        `own`: (inputs, tokens) of the request's own, charged their tokens rather than the
        usual size per input (tokens None: the usual size)."""
        running = max(0.0, self.batch_ends_at - time.monotonic()) if self.running() else 0.0
        if queued_inputs <= 0:
            return running
        batches = math.ceil(queued_inputs / self.max_batch_size)
        tokens = queued_inputs * self.tokens_per_input
        if own is not None and own[1] is not None:
            tokens += own[1] - own[0] * self.tokens_per_input
        queued = self.sec_per_token * (batches * self.overhead_tokens + max(0.0, tokens))
        return running + queued
