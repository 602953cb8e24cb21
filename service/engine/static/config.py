"""Reading a static embedding folder: what `SentenceTransformer(folder)` loads when its
modules.json starts with a `StaticEmbedding` module. No torch (the console script's preflight
reads it).

Served: StaticEmbedding -> optional Normalize, the module's `tokenizer.json` and its weights
(`model.safetensors`, else `pytorch_model.bin`): sentence-transformers' own `embedding.weight`,
or model2vec's `embeddings` with its optional `mapping` and per-token `weights`, folded into one
row per token id as `StaticEmbedding.load` folds them. The folder's prompts apply as they do for
any sentence-transformers model (`prompt + text`).

A bare model2vec folder (its `config.json` says `model_type: model2vec`, no modules.json) is
refused: sentence-transformers loads it only through the `model2vec` package
(`StaticEmbedding.from_model2vec`), so there is no `SentenceTransformer(folder)` to equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.engine.folders import Module, UnsupportedModel, module_kind, read_json

LAYOUT = "StaticEmbedding -> optional Normalize"
_KNOWN = ("StaticEmbedding", "Normalize")
_DEFAULT_PROMPTS = {"query": "", "document": ""}  # every SentenceTransformer has these
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # sentence-transformers' order


@dataclass(frozen=True, kw_only=True)
class StaticConfig:
    """A static embedding folder: where its StaticEmbedding module lies (`module`: relative to
    `folder`, "" for the folder itself), whether a Normalize module follows, and the model's
    prompts (with "query" and "document", "" where the folder has none)."""

    folder: str
    module: str
    normalize: bool
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    @property
    def module_folder(self) -> Path:
        return Path(self.folder) / self.module

    def modules(self) -> tuple[str, ...]:
        """/info's `modules`."""
        return ("StaticEmbedding", "Normalize") if self.normalize else ("StaticEmbedding",)


def _entries(folder: Path) -> list[dict[str, Any]]:
    entries = read_json(folder / "modules.json")
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        return []
    return entries


def is_static(folder: Path) -> bool:
    """`folder` is a sentence-transformers folder with a StaticEmbedding module (anywhere:
    `read_static_config` refuses another layout, naming the one served)."""
    return any(str(e.get("type", "")).endswith(".StaticEmbedding") for e in _entries(folder))


def is_bare_model2vec(folder: Path) -> bool:
    """`folder` is a model2vec `StaticModel` folder without sentence-transformers' files."""
    if (folder / "modules.json").is_file() or not (folder / "config.json").is_file():
        return False
    return bool(read_json(folder / "config.json").get("model_type") == "model2vec")


def model2vec_refusal(model_id: str) -> UnsupportedModel:
    """Why a bare model2vec folder is not served, and what is."""
    return UnsupportedModel(
        f"MODEL_ID={model_id} is a model2vec folder (config.json model_type model2vec, no "
        "modules.json): sentence-transformers loads it only with the model2vec package "
        "(StaticEmbedding.from_model2vec), which this server does not use. Served: a "
        f"sentence-transformers static folder ({LAYOUT}); save one with "
        "SentenceTransformer(modules=[StaticEmbedding.from_model2vec(path)]).save(folder)"
    )


def read_static_config(folder: Path) -> StaticConfig:
    """The folder's static configuration; raises `UnsupportedModel` naming what it cannot
    serve (another module, modules in another order, a missing tokenizer or weights file)."""
    entries = _entries(folder)
    modules = [
        Module(
            kind=module_kind(e, _KNOWN, " in a static embedding model"),
            path=str(e.get("path") or ""),
        )
        for e in entries
    ]
    kinds = [m.kind for m in modules]
    if kinds not in (["StaticEmbedding"], ["StaticEmbedding", "Normalize"]):
        raise UnsupportedModel(
            f"modules.json lists {' -> '.join(kinds)}: a static embedding model is served as "
            f"{LAYOUT}"
        )
    module = "" if modules[0].path == "." else modules[0].path
    where = folder / module
    if not (where / "tokenizer.json").is_file():
        raise UnsupportedModel(f"StaticEmbedding module ({module or '.'}) has no tokenizer.json")
    if not any((where / name).is_file() for name in WEIGHT_FILES):
        raise UnsupportedModel(
            f"StaticEmbedding module ({module or '.'}) has none of {list(WEIGHT_FILES)}"
        )
    model = read_json(folder / "config_sentence_transformers.json")
    prompts = {**_DEFAULT_PROMPTS, **{str(k): str(v) for k, v in model.get("prompts", {}).items()}}
    default = model.get("default_prompt_name")
    if default is not None and default not in prompts:  # SentenceTransformer refuses it too
        raise UnsupportedModel(f"default_prompt_name {default!r} is not one of the prompts")
    return StaticConfig(
        folder=str(folder),
        module=module,
        normalize=len(modules) == 2,
        prompts=prompts,
        default_prompt_name=default,
    )
