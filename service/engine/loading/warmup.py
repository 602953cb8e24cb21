"""Warm-up and calibration: the first batches an engine runs, and the batch cost model fitted from
them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from service.engine.jobs import PARAMS, Op, Unit
from service.engine.params import PipelineParams
from service.engine.pooling import sparse
from service.engine.types import Engine, ModelInfo, Output, Prepared

E = TypeVar("E", bound=Engine)


@dataclass(frozen=True)
class BatchCost:
    """A batch computing `tokens` tokens costs `sec_per_token x (overhead_tokens + tokens)`
    seconds (`service.engine.batching.policy.computed_tokens`: real tokens when packed, inputs
    x longest when padded)."""

    overhead_tokens: float
    sec_per_token: float


def sample_unit(info: ModelInfo, text: str) -> Unit:
    """A unit of the op that carries this model's usual traffic, on `text` cut to the model's
    limit (fill-mask gets the mask token appended): for warm-up and calibration."""
    if info.output is Output.PIPELINE:
        suffix = f" {info.mask_token}" if info.mask_token else ""
        return Unit(op=Op.PIPELINE, text=text + suffix, params=PipelineParams(truncate=True))
    return Unit(op=info.output.op, text=text, params=PARAMS[info.output.op](truncate=True))


def calibrate(engine: Engine) -> BatchCost:
    """Fit the batch cost model from a 1 x 64-token batch and a 16 x 64-token batch, best of 3
    each (warm, unlike the first call). Both are 64 tokens long (no padding: packed and padded
    batches compute the same tokens), so the fitted overhead also
    holds what large batches gain per token (better-filled matrix products), not only the
    fixed cost of a call. Clamped to [8, 4096] tokens. The selector trades padding against the
    overhead; admission starts from this model."""
    word = "word " if engine.info.mask_token is None else f"{engine.info.mask_token} "
    one = [engine.prepare(sample_unit(engine.info, word * min(61, engine.info.max_input_tokens)))]
    many = one * 16

    def best_of_3(batch: list[Prepared]) -> tuple[float, int]:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            engine.run(batch)
            times.append(time.perf_counter() - started)
        return min(times), len(batch) * max(p.n_tokens for p in batch)

    t_one, p_one = best_of_3(one)
    t_many, p_many = best_of_3(many)
    per_token = max(t_many - t_one, 1e-9) / max(p_many - p_one, 1)
    overhead = min(max(max(t_one - per_token * p_one, 0.0) / per_token, 8.0), 4096.0)
    return BatchCost(overhead_tokens=overhead, sec_per_token=t_one / (overhead + p_one))


def warm_up(engine: Engine) -> float:
    """Run one batch of two inputs through the same path as traffic; return its seconds."""
    texts = ["Warm up", "A somewhat longer sentence to warm the model up"]
    started = time.perf_counter()
    engine.run([engine.prepare(sample_unit(engine.info, t)) for t in texts])
    return time.perf_counter() - started


_CHECK_TEXTS = ("Warm up", "A somewhat longer sentence to check the model's outputs")


class NonFiniteOutput(ValueError):
    """The model gives NaN or infinite embeddings at start (e.g. EmbeddingGemma in float16)."""


def check_finite(engine: E) -> E:
    """Run two texts through the engine as traffic would; raise `NonFiniteOutput` (one line,
    naming the dtype) when any answer holds NaN or inf. Returns the engine."""
    info = engine.info
    if info.output not in (Output.POOLED, Output.SPARSE):
        return engine
    params = PARAMS[info.output.op](truncate=True)
    units = [Unit(op=info.output.op, text=t, params=params) for t in _CHECK_TEXTS]
    answers = engine.run([engine.prepare(u) for u in units])
    values = [a.values if isinstance(a, sparse.SparseVector) else a for a in answers]
    if all(np.isfinite(v).all() for v in values):
        return engine
    hint = (
        "its weights give NaN or inf even in float32 (a broken checkpoint?)"
        if info.dtype == "float32"
        else "serve it in float32 (DTYPE=float32); some models, e.g. EmbeddingGemma, overflow "
        "in float16"
    )
    raise NonFiniteOutput(
        f"the model's embeddings are not finite (NaN or inf) in {info.dtype} on "
        f"{info.device}: {hint}"
    )
