"""Which backend computes the encoder engine's forward: the candidates BACKEND/DTYPE allow,
checked and timed on the engine's own inputs (`service.engine.loading.choice.candidates`).

The check and the inputs are the engine's: fixed texts tokenized and padded as traffic is
(`EncoderEngine.prepare_many`, `EncoderEngine.padded`), and every output kind the model serves
compared with float32's as it is served (`service.engine.loading.choice.quality`, which states the
bounds): a pooled model's vectors after its own pooling (`service.engine.pooling.pool`) and its
token rows; token rows (no pooling); a SPLADE model's weights after its own `SpladePooling`
(`service.engine.pooling.sparse`): top-k indices and dot products; a classifier's
probabilities and top labels, a reranker's scores (its own activation) and their order. So
what is checked is what is served, and the backends layer knows tensors only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from service.backends.int8 import CalibrationBatches
from service.engine.forward.encoder import EncoderEngine
from service.engine.loading.choice.candidates import Trial, choose_backend
from service.engine.loading.choice.quality import (
    Quality,
    classifier_quality,
    combined,
    rows_quality,
    sparse_quality,
    vector_quality,
)
from service.engine.loading.choice.ranking import Compare, Inputs
from service.engine.loading.warmup import sample_unit
from service.engine.pooling.calibration import read_set
from service.engine.pooling.pool import pool
from service.engine.pooling.sparse import SpladeSpec, splade_pool
from service.engine.types import Output
from service.settings import Settings

if TYPE_CHECKING:
    import torch

# Fixed texts: the quality check's inputs, and (repeated) the timing batches'.
TEXTS = (
    "A man is playing a guitar.",
    "The stock market fell sharply today, analysts said.",
    "How do I reset my password?",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The quick brown fox jumps over the lazy dog.",
    "Der Zug nach Berlin hat zehn Minuten Verspätung.",
    "Please send the quarterly report to the finance team by Friday at noon.",
    "Is it going to rain tomorrow?",
    "Neural networks learn representations from data by gradient descent on a loss.",
    "She sold seashells by the seashore.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Thanks!",
    "The committee postponed its decision until more evidence could be gathered.",
    "Where is the nearest train station?",
    "An apple a day keeps the doctor away.",
    "The new phone has a faster processor, a brighter screen and a longer battery life.",
)
TIMING_SIZES = (1, 2, 4, 8, 16, 32)


def serve_chosen_backend(
    engine: EncoderEngine, settings: Settings, folder: Path | None
) -> EncoderEngine:
    """`engine` (on torch float32, the reference) now computing on the backend BACKEND/DTYPE
    choose, its `info` naming it with every candidate's measurements (/info's `backend`).
    `folder`: the model's weights (None: not local; no ONNX then)."""
    info = engine.info
    what = f"{info.output}:{','.join(info.pooling or ())}:{info.score_activation}"
    choice = choose_backend(settings, engine.pipe, folder, trial(engine, settings), what)
    engine.backend = choice.backend
    engine.info = dataclasses.replace(
        engine.info,
        backend=choice.backend.name,
        dtype=choice.backend.dtype,
        backend_summary=MappingProxyType(choice.summary()),
        compute=choice.backend.compute,
        padded_up_to=int(getattr(choice.backend, "padded_up_to", 0)),
    )
    return engine


def trial(engine: EncoderEngine, settings: Settings | None = None) -> Trial:
    """The engine's padded inputs for `TEXTS` (the check) and for 1 to 32 of them (timing),
    the check of a candidate's output against float32's for this model's output kind, and
    (with `settings`) the calibration texts' batches (`calibration_batches`)."""
    prepared = [engine.prepare(sample_unit(engine.info, text)) for text in TEXTS]
    quality_inputs = engine.padded(prepared)
    timing = [engine.padded((prepared * 2)[:n]) for n in TIMING_SIZES]
    compare = compare_for(engine, quality_inputs["attention_mask"])
    calibration = calibration_batches(engine, settings.calibration_file) if settings else None
    return Trial(quality_inputs, timing, compare, calibration)


def calibration_batches(engine: EncoderEngine, path: str | None) -> CalibrationBatches:
    """The calibration texts (CALIBRATION_FILE, else the packaged set) as the engine feeds
    them: prepared as traffic, length-sorted, padded batches of 32."""
    texts = read_set(path)

    def batches() -> Iterator[Inputs]:
        ordered = sorted(texts.texts, key=len)
        for start in range(0, len(ordered), 32):
            chunk = ordered[start : start + 32]
            yield engine.padded([engine.prepare(sample_unit(engine.info, t)) for t in chunk])

    return CalibrationBatches(texts.sha256, batches)


def compare_for(engine: EncoderEngine, mask: torch.Tensor) -> Compare:
    """The check of the model's first output on inputs under `mask` [B, L], by what the model
    serves (`Output`): pooled vectors and token rows, token rows, SPLADE weights, or scores."""
    output, info = engine.info.output, engine.info
    if output is Output.CLASSIFIER:
        return lambda ref, out: classifier_quality(ref, out, info.score_activation)
    if output is Output.SPARSE:
        spec = engine.sentence.splade if engine.sentence is not None else None
        assert spec is not None  # a SPARSE model has its SpladePooling
        return lambda ref, out: splade_quality(ref, out, mask, spec)
    if output is Output.TOKEN_ROWS:
        return lambda ref, out: rows_quality(ref, out, mask)
    modes = info.pooling or ("mean",)
    return lambda ref, out: combined(
        embedding_quality(ref, out, mask, modes), rows_quality(ref, out, mask)
    )


def sample_inputs(engine: EncoderEngine, n: int = 2) -> Inputs:
    """The engine's padded inputs for the first `n` of `TEXTS` (an ONNX export's example)."""
    return engine.padded([engine.prepare(sample_unit(engine.info, t)) for t in TEXTS[:n]])


def embedding_quality(
    reference: torch.Tensor, output: torch.Tensor, mask: torch.Tensor, modes: Sequence[str]
) -> Quality:
    """Cosine of each text's pooled vector (token rows [B, L, H] pooled by `modes` under
    `mask` [B, L]) to float32's; not finite when any of `output` is NaN or inf."""
    import torch

    if not bool(torch.isfinite(output).all()):
        return Quality(finite=False)
    modes = tuple(modes)
    return vector_quality(pool(reference, mask, modes), pool(output, mask, modes))


def splade_quality(
    reference: torch.Tensor, output: torch.Tensor, mask: torch.Tensor, spec: SpladeSpec
) -> Quality:
    """`sparse_quality` of the SPLADE weights [B, V] the MLM logits [B, L, V] under `mask`
    [B, L] give, pooled as the model's `spec` says."""
    return sparse_quality(splade_pool(reference, mask, spec), splade_pool(output, mask, spec))
