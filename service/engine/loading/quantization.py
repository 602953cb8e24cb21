"""int8/uint8 embeddings: quantization ranges from a calibration set embedded once at start.

sentence-transformers' scalar quantization (`util.quantize_embeddings(x, "int8", ranges=r)`)
splits each dimension's [min, max] into 256 buckets. The ranges must come from a fixed set of
texts: its default calibrates on the embeddings it is given, so a text's codes would depend on
the other texts of its call. Here the model embeds the calibration texts once at start, in the
inference thread, with the float32 reference backend (so every backend and every replica of a
model gets the same ranges), and keeps their vectors: pooled, Dense heads applied, neither cut
nor normalized (N x D float32, about 0.9 MB for 602 texts at 384 dimensions). The ranges of a
request's vector are each dimension's min and max over those vectors put through the same
finish as the vector itself (cut to `dimensions`, then normalized if asked): made once per
(normalize, dimensions) in the inference thread and kept (`jobs.Ranged` carries them out), so
the codes of a text never depend on its call.

The texts: the package's `service/data/calibration.txt` (written for it; its header says what
they are and where they come from), or CALIBRATION_FILE (UTF-8, one text per line; lines
starting with `#` and empty lines are skipped). /info states their count, SHA-256 and source.

The vectors are cached with the model, as its ONNX graph is (`service.backends.export`):
`$XDG_CACHE_HOME/pipeline-server/calibration/<key>.npy`, `<key>` a SHA-256 of the model folder's
files (`export.cache_key`: names, contents, torch's version), the texts' digest, POOLING and
`FORMAT`. A restart of the same model reads them back instead of embedding the set again
(seconds on a CPU for a small model, minutes for a large one); an unwritable cache is logged
and skipped.

The width of these vectors is what the model really emits: it becomes /info's `dimension` and
the bound of `dimensions`, also where the model's config implies another width (a model that
projects its hidden states inside its forward emits fewer than its hidden size).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import structlog

from service.engine.jobs import Op, Unit
from service.engine.params import EmbedParams
from service.engine.pooling.calibration import Calibration, CalibrationSet, read_set
from service.engine.types import ModelInfo, Prepared

if TYPE_CHECKING:
    from service.backends import Backend

log = structlog.get_logger("service.quantization")

FORMAT = 1  # bumped when what the cached vectors hold changes
_BATCH = 32  # texts per forward while calibrating (sorted by length: little padding)


class EncoderEngine(Protocol):
    """What calibration needs of `service.engine.forward.encoder.EncoderEngine`."""

    info: ModelInfo
    backend: Backend
    calibration: Calibration | None

    def prepare(self, unit: Unit) -> Prepared: ...

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]: ...

    def run(self, batch: list[Prepared]) -> list[Any]: ...


def calibrate(
    engine: EncoderEngine,
    reference: Backend,
    path: Path | str | None,
    folder: Path | None = None,
    pooling: str | None = None,
) -> None:
    """Embed the calibration set (`path`, else the packaged one) with `reference`, or read the
    vectors cached for the model's `folder` (None: not cached) and `pooling` setting; attach
    the `Calibration` to `engine`, and set its info's `dimension` to the width the model
    emits (logged when the config said otherwise) and `calibration` to the set's summary."""
    texts = read_set(path)
    started = time.perf_counter()
    cache = _cache_file(folder, texts, pooling)
    vectors = _cached(cache, len(texts.texts), _emitted_width(engine))
    if vectors is None:
        vectors = embed(engine, texts.texts, reference)
        _store(cache, vectors)
    calibration = Calibration(vectors, texts, time.perf_counter() - started)
    engine.calibration = calibration
    info = engine.info
    if info.dimension != calibration.width:
        log.warning(
            "embedding_width_differs",
            configured=info.dimension,
            emitted=calibration.width,
            hint="the model's forward emits another width than its config implies; served "
            "and checked against what it emits",
        )
    summary = MappingProxyType(calibration.summary())
    engine.info = dataclasses.replace(info, dimension=calibration.width, calibration=summary)
    log.info("calibration_ready", **calibration.summary())


def embed(engine: EncoderEngine, texts: tuple[str, ...], backend: Backend) -> np.ndarray:
    """float32 [N, D]: each text's vector as an `embed` unit answers it with `normalize`
    false (the model's default prompt, truncated at its limit), computed by `backend`, in
    batches of similar length."""
    params = EmbedParams(truncate=True, normalize=False)
    units = [Unit(op=Op.EMBED, text=t, params=params) for t in texts]
    prepared: list[Prepared] = []
    for p in engine.prepare_many(units):
        if isinstance(p, Exception):
            raise p
        prepared.append(p)
    order = sorted(range(len(prepared)), key=lambda i: prepared[i].n_tokens)
    rows: list[Any] = [None] * len(prepared)
    served = engine.backend
    engine.backend = backend  # at start, before traffic: nothing else runs a batch
    try:
        for start in range(0, len(order), _BATCH):
            chunk = order[start : start + _BATCH]
            for i, answer in zip(chunk, engine.run([prepared[i] for i in chunk]), strict=True):
                rows[i] = answer
    finally:
        engine.backend = served
    return np.stack(rows).astype(np.float32)


def _emitted_width(engine: EncoderEngine) -> int:
    """The width of one vector as the served backend computes it (one short forward)."""
    unit = Unit(op=Op.EMBED, text="width", params=EmbedParams(truncate=True, normalize=False))
    return int(np.asarray(engine.run([engine.prepare(unit)])[0]).shape[-1])


def _cache_file(folder: Path | None, texts: CalibrationSet, pooling: str | None) -> Path | None:
    if folder is None:
        return None
    from service.backends.export import cache_key, cache_root

    parts = f"{cache_key(folder)};{texts.sha256};pooling={pooling};v={FORMAT}"
    key = hashlib.sha256(parts.encode()).hexdigest()[:24]
    return cache_root().parent / "calibration" / f"{key}.npy"


def _cached(cache: Path | None, count: int, width: int) -> np.ndarray | None:
    """The cached vectors, if there are any of the right shape and finite."""
    if cache is None or not cache.is_file():
        return None
    try:
        vectors = np.load(cache, allow_pickle=False)
    except (OSError, ValueError) as exc:
        log.warning("calibration_cache_unreadable", path=str(cache), reason=str(exc))
        return None
    if vectors.shape != (count, width) or not np.isfinite(vectors).all():
        return None
    return np.asarray(vectors, dtype=np.float32)


def _store(cache: Path | None, vectors: np.ndarray) -> None:
    """Write the cache (a temporary file renamed: readers never see half of one)."""
    if cache is None:
        return
    from service.backends.export import publish

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".npy", dir=cache.parent)
        with os.fdopen(fd, "wb") as f:
            np.save(f, vectors, allow_pickle=False)
        publish(tmp, cache)
    except OSError as exc:
        log.warning("calibration_cache_unwritable", path=str(cache), reason=str(exc))
