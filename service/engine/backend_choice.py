"""Which backend computes the encoder engine's forward: the candidates BACKEND/DTYPE allow,
checked and timed on the engine's own inputs (`service.backends.candidates`).

The check and the inputs are the engine's: fixed texts tokenized and padded as traffic is
(`EncoderEngine.prepare_many`, `EncoderEngine.padded`), and embeddings compared after the
model's own pooling (`service.engine.pooling.pool`; mean for a model that pools none: token
rows and SPLADE's logits), classifiers on their logits. So what is checked is what is served,
and the backends layer knows tensors only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from service.backends.candidates import Trial, choose_backend
from service.backends.quality import classifier_quality, vector_quality
from service.backends.ranking import Compare, Quality
from service.engine.forward.encoder import EncoderEngine
from service.engine.pooling.pool import pool
from service.engine.types import Output
from service.engine.warmup import sample_unit
from service.settings import Settings

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
    what = f"{engine.info.output}:{','.join(engine.info.pooling or ())}"
    choice = choose_backend(settings, engine.pipe, folder, trial(engine), what)
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


def trial(engine: EncoderEngine) -> Trial:
    """The engine's padded inputs for `TEXTS` (the check) and for 1 to 32 of them (timing),
    and the check of a candidate's output against float32's for this model's output."""
    prepared = [engine.prepare(sample_unit(engine.info, text)) for text in TEXTS]
    quality_inputs = engine.padded(prepared)
    timing = [engine.padded((prepared * 2)[:n]) for n in TIMING_SIZES]
    compare: Compare = classifier_quality
    if engine.info.output is not Output.CLASSIFIER:
        mask, modes = quality_inputs["attention_mask"], engine.info.pooling or ("mean",)

        def compare(reference: Any, output: Any) -> Quality:
            return embedding_quality(reference, output, mask, modes)

    return Trial(quality_inputs, timing, compare)


def sample_inputs(engine: EncoderEngine, n: int = 2) -> Mapping[str, Any]:
    """The engine's padded inputs for the first `n` of `TEXTS` (an ONNX export's example)."""
    return engine.padded([engine.prepare(sample_unit(engine.info, t)) for t in TEXTS[:n]])


def embedding_quality(reference: Any, output: Any, mask: Any, modes: Sequence[str]) -> Quality:
    """Cosine of each text's pooled vector (token rows [B, L, H] pooled by `modes` under
    `mask` [B, L]) to float32's; not finite when any of `output` is NaN or inf."""
    import torch

    if not bool(torch.isfinite(output).all()):
        return Quality(finite=False)
    modes = tuple(modes)
    return vector_quality(pool(reference, mask, modes), pool(output, mask, modes))
