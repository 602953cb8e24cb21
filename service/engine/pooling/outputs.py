"""The embedding answers a batch's forward output gives: pooled vectors through Dense heads,
SPLADE pooling of MLM logits; and what is read at start for them (the heads, the served width).

`EncoderEngine.run` computes the model's first output once per batch; the answers of
`Op.EMBED` and `Op.SPARSE` units are made here from that output and the batch's attention
mask, as sentence-transformers' modules after its Transformer do (`pool`, `heads`, `sparse`);
a BGE-M3 model's `Op.SPARSE`, `Op.MULTI_VECTOR` and `Op.HYBRID` answers from its heads
(`m3`), as FlagEmbedding makes them.
Inference thread only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from service.engine.folders import UnsupportedModel
from service.engine.jobs import Op, Ranged
from service.engine.params import EmbedParams, narrow
from service.engine.pooling import heads, m3, sparse
from service.engine.pooling.pool import finish, normalize_rows, pool
from service.engine.pooling.sentence import SentenceConfig
from service.engine.types import Prepared

if TYPE_CHECKING:
    import torch

    from service.engine.pooling.calibration import Calibration

log = structlog.get_logger("service.outputs")


def load_heads(sentence: SentenceConfig | None, device: Any) -> tuple[heads.DenseHead, ...]:
    """The folder's Dense modules, loaded in order on `device` (none without a config)."""
    if sentence is None or not sentence.dense:
        return ()
    folder = Path(sentence.folder)
    try:
        return tuple(heads.load_dense(folder, spec, device) for spec in sentence.dense)
    except heads.UnsupportedHead as exc:
        raise UnsupportedModel(str(exc)) from None


def served_dimension(sentence: SentenceConfig, config: Any) -> int:
    """The width answers really have: the vocabulary (SPLADE), the last Dense module's
    `out_features`, else the model's hidden size x pooling modes, read from the loaded
    model's config (a Pooling config may declare another width: it is logged, not served).

    Raises `UnsupportedModel` when the first Dense module's `in_features` is not the pooled
    width (sentence-transformers would fail on every input)."""
    if sentence.splade is not None:
        return int(config.vocab_size)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    pooled = int(text.hidden_size) * len(sentence.modes)
    if sentence.declared_dimension not in (None, pooled):
        log.warning(
            "pooling_dimension_differs",
            declared=sentence.declared_dimension,
            served=pooled,
            hint="the Pooling config's embedding_dimension is not the model's hidden size",
        )
    if sentence.dense:
        first = sentence.dense[0]
        if first.in_features != pooled:
            raise UnsupportedModel(
                f"Dense module ({first.path}) takes {first.in_features} features but pooling "
                f"gives {pooled} (hidden size x modes)"
            )
        return sentence.dense[-1].out_features
    return pooled


def embed_rows(
    batch: list[Prepared],
    hidden: torch.Tensor,
    mask: torch.Tensor,
    modes: tuple[str, ...] | None,
    dense: tuple[heads.DenseHead, ...],
    calibration: Calibration | None = None,
) -> dict[int, Any]:
    """Each `Op.EMBED` unit's vector, by batch position: pool `hidden` [B, L, H] under `mask`
    [B, L] by `modes` (`ModelInfo.pooling`) -> the `dense` heads (float32) -> cut to
    `dimensions` and normalize as its params say; with `ranges`, a `Ranged`: the vector and
    the int8 ranges `calibration` gives vectors like it."""
    import torch

    late = late_rows(batch, hidden, mask, dense)
    rows = [i for i, p in enumerate(batch) if p.unit.op is Op.EMBED and i not in late]
    if not rows:
        return late
    assert modes is not None
    prompt = torch.tensor([batch[i].payload.prompt_tokens for i in rows])
    mask = mask.to(hidden.device)
    if len(rows) < len(batch):  # only the embedding units' rows (a copy of theirs)
        index = torch.tensor(rows, device=hidden.device)
        hidden, mask = hidden[index], mask[index]
    vectors = pool(hidden, mask, modes, prompt if prompt.any() else None)
    vectors = heads.apply_dense(vectors, dense)
    # Cut and normalize once for each (normalize, dimensions) the units ask for, not per row.
    shapes: dict[tuple[bool, int | None], list[int]] = {}
    for j, i in enumerate(rows):
        params = narrow(batch[i].unit.params, EmbedParams)
        shapes.setdefault((params.normalize, params.dimensions), []).append(j)
    out: dict[int, Any] = late
    for (normalize, dimensions), js in shapes.items():
        chosen = vectors if len(js) == len(rows) else vectors[torch.tensor(js)]
        finished = finish(chosen, normalize=normalize, dimensions=dimensions).cpu().numpy()
        for j, vector in zip(js, finished, strict=True):
            i = rows[j]
            out[i] = vector
            # int8/uint8: the ranges of this width and normalization
            if narrow(batch[i].unit.params, EmbedParams).ranges:
                assert calibration is not None  # adapters ask only where it was made
                out[i] = Ranged(vector, calibration.ranges(normalize, dimensions))
    return out


def late_rows(
    batch: list[Prepared],
    hidden: torch.Tensor,
    mask: torch.Tensor,
    dense: tuple[heads.DenseHead, ...],
) -> dict[int, Any]:
    """Each late-chunked `Op.EMBED` unit's chunk vectors (its payload's `spans`), by batch
    position: float32 [chunks, D], each the mean of its span's rows of `hidden` [B, L, H]
    (positions counted from the row's first real token under `mask` [B, L]: left padding),
    then the `dense` heads, then cut and normalized as its params say
    (`service.engine.forward.late`)."""
    import torch

    out: dict[int, Any] = {}
    for i, p in enumerate(batch):
        spans = getattr(p.payload, "spans", None) if p.unit.op is Op.EMBED else None
        if spans is None:
            continue
        first = int(mask[i].int().argmax())
        h = hidden[i].float()
        pooled = torch.stack([h[first + a : first + b].mean(dim=0) for a, b in spans])
        params = narrow(p.unit.params, EmbedParams)
        out[i] = (
            finish(
                heads.apply_dense(pooled, dense),
                normalize=params.normalize,
                dimensions=params.dimensions,
            )
            .cpu()
            .numpy()
        )
    return out


def sparse_rows(
    batch: list[Prepared],
    logits: torch.Tensor,
    mask: torch.Tensor,
    sentence: SentenceConfig | None,
) -> dict[int, sparse.SparseVector]:
    """Each `Op.SPARSE` unit's SPLADE vector, by batch position (`max_active_dims` kept), from
    the MLM `logits` [B, L, vocab] under `mask` [B, L], as `sentence`'s SpladePooling says."""
    import torch

    rows = [i for i, p in enumerate(batch) if p.unit.op is Op.SPARSE]
    if not rows:
        return {}
    spec = sentence.splade if sentence is not None else None
    assert spec is not None
    index = torch.tensor(rows, device=logits.device)
    weights = sparse.splade_pool(logits[index], mask.to(logits.device)[index], spec)
    out = {}
    for j, i in enumerate(rows):
        top = narrow(batch[i].unit.params, EmbedParams).max_active_dims
        out[i] = sparse.to_sparse(sparse.keep_top(weights[j : j + 1], top)[0])
    return out


def load_m3(
    sentence: SentenceConfig | None, config: Any, tokenizer: Any, device: Any
) -> m3.M3Heads | None:
    """A BGE-M3 folder's heads on `device` (`config`: the loaded encoder's); None for any
    other model."""
    if sentence is None or not sentence.m3:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    folder = Path(sentence.folder)
    return m3.load_heads(folder, int(text.hidden_size), tokenizer, int(config.vocab_size), device)


def m3_outputs(unit: Any) -> tuple[str, ...]:
    """Which BGE-M3 outputs a unit's answer needs (none for `embed`, made by `embed_rows`)."""
    if unit.op is Op.HYBRID:
        return narrow(unit.params, EmbedParams).outputs
    return {Op.SPARSE: ("sparse",), Op.MULTI_VECTOR: ("multi_vector",)}.get(unit.op, ())


def m3_rows(
    batch: list[Prepared],
    hidden: torch.Tensor,
    mask: torch.Tensor,
    ids: torch.Tensor,
    found: m3.M3Heads,
) -> dict[int, Any]:
    """Each `sparse`, `multi_vector` and `hybrid` unit's answer, by batch position, from the
    encoder's `hidden` [B, L, H] under `mask` [B, L] (right or left padded) for the batch's
    `ids` [B, L]: a `SparseVector` (`max_active_dims` kept), the [n-1, D] ColBERT rows, or a
    dict of the `outputs` a hybrid unit asks. Each head runs once, on the rows that need it."""
    import torch

    asked = {i: m3_outputs(p.unit) for i, p in enumerate(batch)}
    asked = {i: wanted for i, wanted in asked.items() if wanted}
    if not asked:
        return {}
    keep = mask.to(hidden.device).bool()
    first = keep.int().argmax(dim=1).tolist()  # each row's first real token: its [CLS]
    count = keep.sum(dim=1).tolist()
    made: dict[str, dict[int, Any]] = {"dense": {}, "sparse": {}, "multi_vector": {}}
    for name in made:
        rows = [i for i, wanted in asked.items() if name in wanted]
        if not rows:
            continue
        index = torch.tensor(rows, device=hidden.device)
        h = hidden[index]
        if name == "dense":
            cls = h[torch.arange(len(rows)), torch.tensor([first[i] for i in rows])]
            vectors = normalize_rows(cls).cpu().numpy(), cls.cpu().numpy()
            for j, i in enumerate(rows):
                normalize = narrow(batch[i].unit.params, EmbedParams).normalize
                made[name][i] = vectors[0][j] if normalize else vectors[1][j]
        elif name == "sparse":
            weights = m3.token_weights(h, found).cpu().numpy()
            ids_ = ids[index].cpu().numpy()
            for j, i in enumerate(rows):
                cols = slice(first[i], first[i] + count[i])
                vector = m3.lexical_weights(weights[j, cols], ids_[j, cols], found)
                top = narrow(batch[i].unit.params, EmbedParams).max_active_dims
                made[name][i] = m3.keep_top(vector, top)
        else:
            vectors_ = m3.colbert_vectors(h, found).cpu().numpy()
            for j, i in enumerate(rows):
                made[name][i] = vectors_[j, first[i] + 1 : first[i] + count[i]]
    out: dict[int, Any] = {}
    for i, wanted in asked.items():
        if batch[i].unit.op is Op.HYBRID:
            out[i] = {name: made[name][i] for name in wanted}
        else:
            out[i] = made[wanted[0]][i]
    return out
