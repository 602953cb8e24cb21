"""Serving a loaded multi-vector model: its `ModelInfo` and the engine on the torch backend.

`service.engine.loading.load` builds the pipeline (the Transformer module's encoder and tokenizer,
set up as sentence-transformers sets them up) and hands it here. The forward runs on torch:
float32 by default (the dtype every answer is checked against), bfloat16 or float16 when
DTYPE asks; onnxruntime is not offered for these models (BACKEND=onnx, DTYPE=int8 refused).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

from service.backends.torch_backend import TorchBackend, converted
from service.engine.jobs import Op
from service.engine.multi_vector.config import MultiVectorConfig
from service.engine.multi_vector.engine import MultiVectorEngine
from service.engine.types import ModelInfo, Output
from service.settings import Settings


def multi_vector_engine(
    pipe: Any,
    settings: Settings,
    *,
    model_id: str,
    served_name: str,
    config: MultiVectorConfig,
    limit: int,
) -> MultiVectorEngine:
    """The engine for `pipe` (its tokenizer already cut at `limit` tokens). Raises
    `ValueError` (one line) for a backend or dtype these models are not served on."""
    import torch

    if settings.backend == "onnx" or settings.dtype == "int8":
        raise ValueError(
            "multi-vector models are served on torch: BACKEND=onnx and DTYPE=int8 do not apply "
            "(set BACKEND=torch or auto, DTYPE=float32, bfloat16, float16 or auto)"
        )
    register_prefixes(pipe.tokenizer, config.prefix_tokens)
    model = pipe.model
    if settings.dtype in ("bfloat16", "float16"):
        model = converted(model, settings.dtype)
    backend = TorchBackend(model, pipe.device)
    config_ = pipe.model.config
    hidden = int(config_.get_text_config().hidden_size)
    dimension = config.dense[-1].out_features if config.dense else hidden
    if config.dense and config.dense[0].in_features != hidden:
        first = config.dense[0]
        raise ValueError(
            f"Dense module ({first.path}) takes {first.in_features} features but the encoder "
            f"gives {hidden}"
        )
    info = ModelInfo(
        model_id=model_id,
        revision=settings.revision,
        task="feature-extraction",
        output=Output.MULTI_VECTOR,
        ops=frozenset({Op.MULTI_VECTOR, Op.TOKENIZE, Op.DECODE}),
        device=str(pipe.device),
        dtype=backend.dtype,
        torch_threads=torch.get_num_threads(),
        max_input_tokens=limit,
        mask_token=None,
        vocab_size=len(pipe.tokenizer),
        normalize=config.normalize,
        dimension=dimension,
        prompts=MappingProxyType(dict(config.prompts)),
        served_name=served_name,
        modules=config.modules(),
        backend="torch",
    )
    engine = MultiVectorEngine(pipe, info, config, backend)
    engine.info = dataclasses.replace(info, multi_vector=MappingProxyType(_summary(engine)))
    return engine


def register_prefixes(tok: Any, prefixes: tuple[str, ...]) -> None:
    """PyLate's prefixes (`"[Q] "`, `"[unused0]"`) registered on the tokenizer as non-normalized
    special tokens, as `MultiVectorEncoder._register_prefix_tokens` does, so that the prompt
    text tokenizes to the one token PyLate inserted: for each, the whole value or else its first
    word, when the tokenizer knows it and does not already give it as one token."""
    from transformers import AddedToken

    added = set(getattr(tok, "added_tokens_encoder", None) or {})
    vocab = tok.get_vocab()
    register = []
    for value in prefixes:
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in added and prefix not in vocab:
                continue
            if tok.tokenize(prefix) != [prefix]:
                register.append(AddedToken(prefix, normalized=False, special=True))
            break
    if register:
        tok.add_special_tokens({"additional_special_tokens": register})


def _summary(engine: MultiVectorEngine) -> dict[str, Any]:
    """/info's `multi_vector`: the token vectors' width, the scoring, each input type's most
    tokens, the query expansion and the folder's token pooling (None: none)."""
    expansion, pooling = engine.config.expansion, engine.config.pooling
    return {
        "dimension": engine.info.dimension,
        "scoring": engine.config.similarity,
        "query_length": engine.limit("query"),
        "document_length": engine.limit("document"),
        "query_expansion": None
        if expansion is None
        else {
            "strategy": expansion.strategy,
            "length": expansion.length,
            "attend": expansion.attend,
        },
        "token_pooling": None
        if pooling is None
        else {
            "pool_factor": pooling.pool_factor,
            "max_tokens": pooling.max_tokens,
            "distance_threshold": pooling.distance_threshold,
            "protected_tokens": pooling.protected_tokens,
            "tasks": list(pooling.tasks),
        },
    }
