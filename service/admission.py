"""Admission: the service-time estimate behind deadline-aware shedding and `Retry-After`.

The estimate is an exponentially weighted moving average of seconds per input, measured on
every batch (batch seconds / inputs). With depth D inputs queued, a new request of N inputs is
predicted to finish after about (D + N) x per-input seconds plus what is left of the running
batch: Little's law on a single server (Kleinrock, *Queueing Systems*, vol. 1), with the
per-input cost measured at the batch sizes the load actually forms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Weight of the newest batch: ~10 batches of memory, fast enough to follow a change of load.
_ALPHA = 0.2


@dataclass
class ServiceTimeEstimate:
    """Seconds per input (EWMA) and the running batch's expected end (monotonic seconds).

    Written by the inference thread, read by the event loop: each field is one float, and a
    stale read only makes one admission decision one batch out of date.
    """

    per_input_s: float = 0.05
    batch_ends_at: float = 0.0

    def observe(self, seconds: float, inputs: int) -> None:
        """Fold in one finished batch of `inputs` inputs that took `seconds`."""
        sample = seconds / max(1, inputs)
        self.per_input_s += _ALPHA * (sample - self.per_input_s)

    def batch_started(self, inputs: int) -> None:
        self.batch_ends_at = time.monotonic() + inputs * self.per_input_s

    def predicted_wait(self, queued_inputs: int) -> float:
        """Seconds until `queued_inputs` more inputs (those ahead plus one's own) are done."""
        running = max(0.0, self.batch_ends_at - time.monotonic())
        return running + queued_inputs * self.per_input_s
