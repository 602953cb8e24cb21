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


def _summary(engine: MultiVectorEngine) -> dict[str, Any]:
    """/info's `multi_vector`: the token vectors' width, the scoring, each input type's most
    tokens, and the query expansion (None: none)."""
    expansion = engine.config.expansion
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
    }
