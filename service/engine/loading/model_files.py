"""What a model's files say before its weights load: its config.json, its sentence-transformers
configuration (the folder's or the `POOLING` setting's), and where its files are (a local folder
or the hub's cached snapshot). No torch; transformers and huggingface_hub are imported lazily.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import structlog

from service.engine.folders import UnsupportedModel, is_m3
from service.engine.llm_rerank.config import (
    RerankerConfig,
    is_causal_reranker,
    read_reranker_config,
)
from service.engine.loading import st_config
from service.engine.multi_vector.config import (
    MultiVectorConfig,
    is_multi_vector,
    read_multi_vector_config,
)
from service.engine.pooling.sentence import SentenceConfig
from service.engine.static.config import (
    StaticConfig,
    is_bare_model2vec,
    is_static,
    model2vec_refusal,
    read_static_config,
)
from service.settings import Settings

log = structlog.get_logger("service.loading")


def config_json(model_id: str, settings: Settings) -> dict[str, Any]:
    """The model's config.json as a dict (a local folder, or the hub's cache / the hub)."""
    config_file = Path(model_id) / "config.json"
    if config_file.is_file():
        return dict(json.loads(config_file.read_text()))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model_id, revision=settings.revision, trust_remote_code=settings.trust_remote_code
    )
    return dict(config.to_dict())


def is_splade(model_id: str, settings: Settings) -> bool:
    """POOLING=splade, or a local sentence-transformers SparseEncoder folder (SpladePooling)."""
    if settings.pooling == "splade":
        return True
    if settings.pooling == "none" or not Path(model_id).is_dir():
        return False
    try:
        found = st_config.read_sentence_config(Path(model_id))
    except (UnsupportedModel, ValueError, OSError):
        return False  # refused with its message where the task needs it (preflight)
    return found is not None and found.splade is not None


def multi_vector_config(model_id: str, settings: Settings) -> MultiVectorConfig | None:
    """The folder's MultiVectorEncoder configuration (`service.engine.multi_vector.config`),
    or None for any other model (and with `POOLING=none`: token rows). Raises
    `UnsupportedModel` for an option it does not serve, or a POOLING on such a folder."""
    if settings.pooling == "none":
        return None
    folder = local_folder(model_id, settings)
    if folder is None or not is_multi_vector(folder):
        return None
    if settings.pooling is not None:
        raise UnsupportedModel(
            f"POOLING={settings.pooling} does not apply to a multi-vector model (its answers are "
            "token vectors: /embed_multi); unset POOLING"
        )
    return read_multi_vector_config(folder)


def causal_reranker_config(model_id: str, settings: Settings) -> RerankerConfig | None:
    """The folder's causal-LM CrossEncoder configuration (`service.engine.llm_rerank.config`),
    or None for any other model. Raises `UnsupportedModel` for an option it does not serve."""
    folder = local_folder(model_id, settings)
    if folder is None or not is_causal_reranker(folder):
        return None
    return read_reranker_config(folder)


def static_config(model_id: str, settings: Settings) -> StaticConfig | None:
    """The folder's static embedding configuration (`service.engine.static.config`), or None
    for any other model. Raises `UnsupportedModel` for a layout it does not serve, and for a
    bare model2vec folder (naming what is served)."""
    folder = local_folder(model_id, settings)
    if folder is None:
        return None
    if is_bare_model2vec(folder):
        raise model2vec_refusal(model_id)
    if not is_static(folder):
        return None
    if not Path(model_id).is_dir():  # a hub model: its tokenizer and rows too
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_id, revision=settings.revision))
    return read_static_config(folder)


def sentence_config(model_id: str, settings: Settings) -> SentenceConfig | None:
    """The sentence-transformers configuration of the model's folder (pooling, normalization,
    max_seq_length, prompts), or the `POOLING` setting's; None for token rows only.
    `POOLING=none` keeps token rows even for a sentence-transformers model."""
    if settings.pooling == "none":
        return None
    folder = local_folder(model_id, settings)
    if folder is not None and is_m3(folder):
        return m3_config(folder, model_id, settings)
    found = st_config.read_sentence_config(folder) if folder is not None else None
    if settings.pooling is None:
        return found
    hidden = int(config_json(model_id, settings).get("hidden_size") or 0)
    chosen = st_config.config_for_pooling(settings.pooling, hidden)
    if found is None:
        return chosen
    if chosen.splade is not None:
        return dataclasses.replace(found, modes=(), dense=(), normalize=False, splade=chosen.splade)
    return dataclasses.replace(found, modes=chosen.modes, dimension=chosen.dimension)


def m3_config(folder: Path, model_id: str, settings: Settings) -> SentenceConfig:
    """A BGE-M3 folder's configuration: CLS pooling, normalized (`BGEM3FlagModel`'s dense,
    whatever a sentence-transformers config beside it says), with its max_seq_length, lower
    casing and prompts where it has one. Raises `UnsupportedModel` for a POOLING setting."""
    if settings.pooling is not None:
        raise UnsupportedModel(
            f"POOLING={settings.pooling} does not apply to a BGE-M3 folder (its dense vector is "
            "the CLS token's, normalized); unset POOLING, or POOLING=none for token rows"
        )
    found = st_config.read_sentence_config(folder)
    if found is not None and (found.modes != ("cls",) or found.dense or not found.normalize):
        log.warning(
            "m3_sentence_config_ignored",
            modules=list(found.modules()),
            hint="a BGE-M3 folder's dense vector is its CLS token's, normalized",
        )
    hidden = int(config_json(model_id, settings).get("hidden_size") or 0)
    base = found or SentenceConfig(modes=("cls",), dimension=hidden)
    return dataclasses.replace(
        base,
        modes=("cls",),
        dimension=hidden,
        include_prompt=True,
        normalize=True,
        dense=(),
        splade=None,
        folder=str(folder),
        transformer_path="",
        declared_dimension=None,
        m3=True,
    )


def local_folder(model_id: str, settings: Settings) -> Path | None:
    """A folder holding the model's sentence-transformers files: the local folder itself,
    or the hub snapshot of those files (from the cache when offline); None if neither."""
    if Path(model_id).is_dir():
        return Path(model_id)
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                model_id,
                revision=settings.revision,
                allow_patterns=["modules.json", "*.json", "*/config.json"],
            )
        )
    except Exception:
        log.warning("sentence_config_unavailable", model_id=model_id)
        return None


def weights_folder(weights: str, settings: Settings) -> Path | None:
    """The local folder of the model's weights (a hub model's cached snapshot), or None."""
    if Path(weights).is_dir():
        return Path(weights)
    try:
        from transformers.utils import cached_file

        found = cached_file(weights, "config.json", revision=settings.revision)
    except Exception:
        return None
    return Path(found).parent if found else None
