"""Choosing a backend at start: time each candidate, check it against torch float32, serve the
fastest that keeps the answers. Pure logic over candidates and a clock (tests pass fakes).

The checks, on fixed texts against torch float32's outputs, one per output kind the engine
serves, and their bounds are `service.engine.loading.choice.quality`'s; the engine picks those of
its model (`service.engine.loading.choice.backend_choice`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from service.backends import Backend
from service.engine.loading.choice.quality import Quality

if TYPE_CHECKING:
    import torch

#: A padded batch as the engine feeds a backend: int64 [B, L] by input name.
Inputs: TypeAlias = "Mapping[str, torch.Tensor]"


@dataclass(frozen=True)
class Candidate:
    """A backend this machine can run: `build()` makes it (may raise: an export failure)."""

    backend: str
    dtype: str
    build: Callable[[], Backend]


@dataclass(frozen=True)
class Measured:
    """A candidate's measured speed (inputs/s by batch size) and quality, or why it failed."""

    backend: str
    dtype: str
    inputs_per_s: Mapping[int, float] = field(default_factory=dict)
    quality: Quality | None = None
    padded_tokens: Mapping[int, int] = field(default_factory=dict)  # each timing batch's B x L
    error: str | None = None
    compute: str = "padded"  # "packed": real tokens only (`service.backends.packed`)

    @property
    def passed(self) -> bool:
        return self.error is None and self.quality is not None and self.quality.passes()

    def speed(self) -> float:
        """Inputs/s at the largest batch measured (what the server does under load)."""
        return self.inputs_per_s[max(self.inputs_per_s)] if self.inputs_per_s else 0.0

    def cost(self) -> tuple[float, float]:
        """The batch cost line `seconds = fixed + per_token * padded tokens`, least squares
        over the timing batches (per_token clamped at >= 0). (0, 0) when unmeasured."""
        points = [
            (float(self.padded_tokens.get(size, size)), size / speed)
            for size, speed in self.inputs_per_s.items()
            if speed > 0
        ]
        if not points:
            return 0.0, 0.0
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        var = sum((x - mx) ** 2 for x, _ in points)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0
        return max(0.0, my - slope * mx), slope

    def seconds(self, padded_tokens: float) -> float:
        """Predicted seconds of a batch of `padded_tokens` (B x L) on this candidate."""
        fixed, per_token = self.cost()
        return fixed + per_token * padded_tokens

    def summary(self) -> dict[str, object]:
        """One row of /info's `candidates` and the start log line."""
        row: dict[str, object] = {"backend": self.backend, "dtype": self.dtype}
        row["compute"] = self.compute
        row["inputs_per_s"] = {str(b): round(v, 1) for b, v in sorted(self.inputs_per_s.items())}
        if self.quality is not None:
            row["quality"] = self.quality.summary()
        if self.error is not None:
            row["error"] = self.error
        return row


#: (float32's output, the candidate's) -> their quality.
Compare: TypeAlias = "Callable[[torch.Tensor, torch.Tensor], Quality]"
Clock = Callable[[], float]


def measure(
    candidate: Candidate,
    reference: torch.Tensor,
    quality_inputs: Inputs,
    timing: Sequence[Inputs],
    compare: Compare,
    clock: Clock = time.perf_counter,
    repeats: int = 2,
) -> tuple[Measured, Backend | None]:
    """Build `candidate`, check its output on `quality_inputs` against `reference` (torch
    float32's output there), and time it on each batch of `timing`: one untimed run (first
    calls allocate and pick kernels), then the best of `repeats`. A candidate that fails to
    build or run is returned with its `error` (one line) and no backend."""
    try:
        backend = candidate.build()
        quality = compare(reference, backend.forward(quality_inputs))
        speeds: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for inputs in timing:
            size = int(inputs["input_ids"].shape[0])
            tokens[size] = int(inputs["input_ids"].numel())
            backend.forward(inputs)
            best = math.inf
            for _ in range(repeats):
                started = clock()
                backend.forward(inputs)
                best = min(best, clock() - started)
            speeds[size] = size / max(best, 1e-9)
    except Exception as exc:
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return Measured(candidate.backend, candidate.dtype, error=why), None
    compute = str(getattr(backend, "compute", "padded"))
    return Measured(
        candidate.backend, candidate.dtype, speeds, quality, tokens, compute=compute
    ), backend


def fastest_passing(measured: Sequence[Measured]) -> int | None:
    """Index of the fastest candidate (inputs/s at the largest batch) that passed its checks;
    None if none did."""
    passing = [i for i, m in enumerate(measured) if m.passed]
    return max(passing, key=lambda i: measured[i].speed()) if passing else None


# A second backend for small batches is kept only where it saves at least this share of the
# batch's time at the smallest timing batch (below that, timing noise decides: one backend).
ROUTE_GAIN = 0.15


@dataclass(frozen=True)
class Route:
    """Batches of at most `max_tokens` padded tokens (B x L) go to candidate `small`; larger
    ones to `large` (`max_tokens` 0: every batch goes to `large`)."""

    large: int
    small: int | None = None
    max_tokens: int = 0


def route(measured: Sequence[Measured], large: int) -> Route:
    """Which passing candidate serves small batches, beside `large` (the fastest at the
    largest batch, `fastest_passing`), and up to how many padded tokens.

    Each candidate's batch cost is the line `fixed + per_token * tokens` fitted to its timing
    batches (`Measured.cost`); batch shapes differ in what bounds them: a single short input
    pays mostly the fixed cost of calling every operator (where onnxruntime's fused graph
    is cheaper), a large batch pays per token (where bfloat16 matrix units are faster). The
    small-batch candidate is the passing one that is cheapest at the smallest timing batch,
    kept when it saves `ROUTE_GAIN` of that batch's time there; it serves batches up to the
    padded-token count where the two lines cross. Where the cheaper one at small batches
    has the lower per-token cost too, it would already be `large`."""
    smallest = min(measured[large].padded_tokens.values(), default=0)
    if not smallest:
        return Route(large)
    passing = [i for i, m in enumerate(measured) if m.passed and i != large]
    if not passing:
        return Route(large)
    best = min(passing, key=lambda i: measured[i].seconds(smallest))
    here, there = measured[best].seconds(smallest), measured[large].seconds(smallest)
    if here > (1 - ROUTE_GAIN) * there:
        return Route(large)
    (f_small, k_small), (f_large, k_large) = measured[best].cost(), measured[large].cost()
    if k_small <= k_large:  # cheaper at every size: only timing noise made it not `large`
        return Route(large)
    crossing = (f_large - f_small) / (k_small - k_large)
    return Route(large, best, round(crossing)) if crossing >= smallest else Route(large)
