"""Loading a static embedding model: its tokenizer and rows as `StaticEmbedding.load` reads them,
its `ModelInfo` and the engine. Computed in float32 on the CPU (an embedding bag is a gather and
a mean: no accelerator or other backend pays for it); BACKEND=onnx, other dtypes, a POOLING and a
task other than feature-extraction are refused in one line naming what is served. Inference
thread only (torch, tokenizers and safetensors are imported here).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from service.engine.jobs import Op
from service.engine.static.config import WEIGHT_FILES, StaticConfig
from service.engine.static.engine import StaticEngine
from service.engine.types import ModelInfo, Output
from service.settings import Settings

if TYPE_CHECKING:
    import torch

#: `max_input_tokens` of a model without a limit (sentence-transformers' is infinite): what a
#: body of MAX_BODY_BYTES cannot exceed by much, so length checks elsewhere never bind.
NO_LIMIT = 1 << 24


def check_settings(settings: Settings) -> None:
    """Raise `ValueError` (one line) for a setting that does not apply to a static model."""
    served = (
        "a static embedding model serves feature-extraction (sentence embeddings) in float32 "
        "on the CPU"
    )
    if settings.task and settings.task != "feature-extraction":
        raise ValueError(f"TASK={settings.task} does not apply: {served}; unset TASK")
    if settings.pooling is not None:
        raise ValueError(f"POOLING={settings.pooling} does not apply: {served}; unset POOLING")
    if settings.backend == "onnx" or settings.dtype not in ("auto", "float32"):
        raise ValueError(
            f"BACKEND={settings.backend} DTYPE={settings.dtype} do not apply: {served} "
            "(set BACKEND=torch or auto, DTYPE=float32 or auto)"
        )


def static_engine(
    settings: Settings, *, model_id: str, served_name: str, config: StaticConfig
) -> StaticEngine:
    """The engine for the folder `config` describes. Raises `ValueError` for a setting that
    does not apply (`check_settings`)."""
    import torch
    from tokenizers import Tokenizer

    check_settings(settings)
    tokenizer = Tokenizer.from_file(str(config.module_folder / "tokenizer.json"))
    tokenizer.no_padding()  # as StaticEmbedding sets it
    weight, source = read_weights(config)
    truncation = tokenizer.truncation  # a tokenizer.json may cut as sentence-transformers does
    limit = int(truncation["max_length"]) if truncation else None
    info = ModelInfo(
        model_id=model_id,
        revision=settings.revision,
        task="feature-extraction",
        output=Output.POOLED,
        ops=frozenset({Op.EMBED, Op.TOKENIZE, Op.DECODE}),
        device="cpu",
        dtype="float32",
        torch_threads=torch.get_num_threads(),
        max_input_tokens=limit or NO_LIMIT,
        mask_token=None,
        vocab_size=int(weight.shape[0]),
        normalize=config.normalize,
        dimension=int(weight.shape[1]),
        prompts=MappingProxyType(dict(config.prompts)),
        default_prompt_name=config.default_prompt_name,
        served_name=served_name,
        modules=config.modules(),
        backend="torch",
        compute="packed",
        static=MappingProxyType(
            {
                "dimension": int(weight.shape[1]),
                "vocabulary": int(weight.shape[0]),
                "max_input_tokens": limit,
                "weights": source,
            }
        ),
    )
    return StaticEngine(tokenizer, weight, info)


def read_weights(config: StaticConfig) -> tuple[torch.Tensor, str]:
    """float32 [vocabulary, D] rows, one per token id, and their layout ("sentence-transformers"
    or "model2vec"): `embedding.weight`, else model2vec's `embeddings` indexed by its
    `mapping` and scaled by its per-token `weights` (`StaticEmbedding._fold_model2vec_weights`)."""
    import torch

    tensors = _state_dict(config)
    if "embedding.weight" in tensors:
        return tensors["embedding.weight"].float().contiguous(), "sentence-transformers"
    rows = tensors["embeddings"].float()
    if (mapping := tensors.get("mapping")) is not None:
        rows = rows[mapping.to(torch.long)]
    if (weights := tensors.get("weights")) is not None:
        rows = rows * weights.float()[:, None]
    return rows.contiguous(), "model2vec"


def _state_dict(config: StaticConfig) -> dict[str, Any]:
    import torch

    folder = config.module_folder
    name = next(n for n in WEIGHT_FILES if (folder / n).is_file())
    if name.endswith(".safetensors"):
        from safetensors.torch import load_file

        return dict(load_file(str(folder / name)))
    return dict(torch.load(folder / name, map_location="cpu", weights_only=True))
