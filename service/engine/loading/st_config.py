"""Reading a sentence-transformers folder: its modules, pooling config, prompts and tokenizer setup.

`SentenceTransformer(folder).encode(texts)` is Transformer -> Pooling -> (Normalize). We run the
transformer ourselves on one padded batch; this module reads what the rest must do
(`service.engine.pooling.pool` computes it), equal to sentence-transformers within float32
rounding. Reading a folder needs no torch (the event loop may call `read_sentence_config`).

How sentence-transformers 6 tokenizes (so the server can call the tokenizer itself):
`tokenizer(texts, padding=True, truncation="longest_first", return_tensors="pt")`, special
tokens added, no `max_length` argument: the tokenizer's `model_max_length`, which ST sets to
`max_seq_length` (else caps at `max_position_embeddings`; see `configure_tokenizer`). The
tokenizer's own padding side. The text is neither stripped nor lower-cased in Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from service.engine.folders import (
    SCORE_ACTIVATIONS,
    Module,
    UnsupportedModel,
    module_kind,
    read_json,
)
from service.engine.pooling.heads import UnsupportedHead, read_dense
from service.engine.pooling.sentence import MODES, SentenceConfig
from service.engine.pooling.sparse import ACTIVATIONS, STRATEGIES, SpladeSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_LEGACY_MODE_KEYS = {  # pre-6 `1_Pooling/config.json` booleans, in the same order
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


_MODE_ALIASES = {"last-token": "lasttoken", "last_token": "lasttoken"}  # TEI's POOLING spelling


# The module classes we apply, by class name (5.x `sentence_transformers.models.X` and
# `sentence_transformers.sparse_encoder.models.X`, 6.x `sentence_transformers.<area>.modules.
# <module>.X` name the same classes); the layouts are checked by `_check_layout`.
_KNOWN = ("Transformer", "MLMTransformer", "Pooling", "Dense", "Normalize", "SpladePooling")


_DENSE_LAYOUT = "Transformer -> Pooling -> Dense (any number) -> optional Normalize"


_SPARSE_LAYOUT = "Transformer (fill-mask) or MLMTransformer -> SpladePooling"


_MODEL_TYPES = ("SentenceTransformer", "SparseEncoder")


_DEFAULT_PROMPTS = {"query": "", "document": ""}  # every SentenceTransformer has these


_TRANSFORMER_CONFIGS = tuple(  # the names ST tries, first found wins
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)


def read_sentence_config(folder: Path) -> SentenceConfig | None:
    """Read a sentence-transformers folder (5.x or 6.x layout); None without `modules.json`.

    Served: Transformer -> Pooling -> Dense... -> optional Normalize (SentenceTransformer) and
    Transformer/MLMTransformer -> SpladePooling (SparseEncoder). Raises `UnsupportedModel`
    (naming the module, file or mode) for anything else: a Router, a custom module, a
    chat-template (message) Transformer, a Normalize on token rows.
    """
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    entries = _read_json(modules_file)
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        raise UnsupportedModel("modules.json is not a list of modules")
    modules = [Module(kind=module_kind(e, _KNOWN), path=str(e.get("path", ""))) for e in entries]
    st_file = folder / "config_sentence_transformers.json"
    model = read_json(st_file)
    model_type = model.get("model_type", "SentenceTransformer")
    if model_type not in _MODEL_TYPES:
        raise UnsupportedModel(f"a {model_type} model is not supported (embeddings only)")
    sparse = _check_layout(modules)
    transformer = _transformer_config(folder / modules[0].path, sparse=sparse)
    prompts = {**_DEFAULT_PROMPTS, **{str(k): str(v) for k, v in model.get("prompts", {}).items()}}
    default = model.get("default_prompt_name")
    if default is not None and default not in prompts:  # SentenceTransformer refuses it too
        raise UnsupportedModel(f"default_prompt_name {default!r} is not one of the prompts")
    max_seq_length = transformer.get("max_seq_length")
    common: _Common = {
        "include_prompt": True,
        "max_seq_length": None if max_seq_length is None else int(max_seq_length),
        "do_lower_case": bool(transformer.get("do_lower_case", False)),
        "prompts": prompts,
        "default_prompt_name": default,
        "transformer_path": modules[0].path,
        "folder": str(folder),
    }
    if sparse:
        splade = _splade_spec(folder / modules[1].path, modules[1].path)
        return SentenceConfig(modes=(), dimension=0, normalize=False, splade=splade, **common)
    pooling = _read_json(folder / modules[1].path / "config.json")
    modes = _pooling_modes(pooling, f"{modules[1].path}/config.json")
    if modules[-1].kind == "Normalize":
        _check_normalize(folder / modules[-1].path / "config.json", modules[-1].path)
    width = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
    if not isinstance(width, int):
        raise UnsupportedModel(f"{modules[1].path}/config.json has no embedding_dimension")
    try:
        dense = tuple(read_dense(folder, m.path) for m in modules if m.kind == "Dense")
    except UnsupportedHead as exc:
        raise UnsupportedModel(str(exc)) from None
    common["include_prompt"] = bool(pooling.get("include_prompt", True))
    return SentenceConfig(
        modes=modes,
        dimension=dense[-1].out_features if dense else width * len(modes),
        normalize=modules[-1].kind == "Normalize",
        dense=dense,
        declared_dimension=width * len(modes),
        matryoshka_dimensions=matryoshka_dimensions(folder),
        **common,
    )


class _Common(TypedDict):
    """What a dense and a SPLADE folder's `SentenceConfig` share."""

    include_prompt: bool
    max_seq_length: int | None
    do_lower_case: bool
    prompts: dict[str, str]
    default_prompt_name: str | None
    transformer_path: str
    folder: str


def _check_layout(modules: list[Module]) -> bool:
    """True for a SPLADE layout, False for a dense one; `UnsupportedModel` for any other."""
    kinds = [m.kind for m in modules]
    if kinds in (["Transformer", "SpladePooling"], ["MLMTransformer", "SpladePooling"]):
        return True
    middle = kinds[2:-1] if kinds[-1:] == ["Normalize"] else kinds[2:]
    if kinds[:2] == ["Transformer", "Pooling"] and all(k == "Dense" for k in middle):
        return False
    raise UnsupportedModel(
        f"modules.json lists {' -> '.join(kinds)}: only {_DENSE_LAYOUT}, or "
        f"{_SPARSE_LAYOUT}, is supported"
    )


def _splade_spec(folder: Path, where: str) -> SpladeSpec:
    config = read_json(folder / "config.json")
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in STRATEGIES or activation not in ACTIVATIONS:
        raise UnsupportedModel(
            f"SpladePooling ({where}) with pooling_strategy {strategy!r} and activation "
            f"{activation!r} is not supported; use {STRATEGIES} and {ACTIVATIONS}"
        )
    return SpladeSpec(strategy=strategy, activation=activation)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def matryoshka_dimensions(folder: Path) -> tuple[int, ...] | None:
    """The widths a model was trained to be cut to: `matryoshka_dimensions` in config.json
    (vLLM's key; `is_matryoshka: true` alone: any width, `()`), else `()` when its
    sentence-transformers model card names MatryoshkaLoss; None when neither says so."""
    config_file = folder / "config.json"
    config = read_json(config_file)
    listed = config.get("matryoshka_dimensions")
    if isinstance(listed, list) and all(isinstance(d, int) for d in listed):
        return tuple(sorted(listed))
    if config.get("is_matryoshka") is True:
        return ()
    card = folder / "README.md"
    if card.is_file() and "MatryoshkaLoss" in card.read_text(encoding="utf-8", errors="replace"):
        return ()
    return None


def config_for_pooling(mode: str, hidden_size: int) -> SentenceConfig:
    """A plain model (no modules.json) pooled with one mode (POOLING=<mode>), normalized as TEI
    does by default; no max_seq_length (the tokenizer's limit). `splade` (TEI's name): a
    `*ForMaskedLM` model's logits, max-pooled after log1p(relu) (`SpladePooling`'s defaults),
    not normalized."""
    if mode == "splade":
        return SentenceConfig(modes=(), dimension=0, normalize=False, splade=SpladeSpec())
    return SentenceConfig(
        modes=_check_modes([_MODE_ALIASES.get(mode, mode)], "POOLING"), dimension=hidden_size
    )


def _transformer_config(folder: Path, *, sparse: bool) -> dict[str, Any]:
    """The Transformer module's config (`sentence_bert_config.json` or a legacy name).

    A `message` modality means sentence-transformers 6 renders every text through the
    tokenizer's chat template (`InputFormatter.batch_to_message`) before tokenizing; the
    server tokenizes plain text, so such a folder is refused rather than answered differently
    from `encode`."""
    config: dict[str, Any] = next(
        (_read_json(folder / n) for n in _TRANSFORMER_CONFIGS if (folder / n).is_file()), {}
    )
    wanted = "fill-mask" if sparse else "feature-extraction"
    task = config.get("transformer_task", wanted)
    modalities = sorted(config.get("modality_config", {"text": None}))
    if "message" in modalities:
        raise UnsupportedModel(
            f"Transformer module declares modalities {modalities}: sentence-transformers renders "
            "each text through the model's chat template (as a chat message) before tokenizing, "
            "which this server does not do; its answers would differ from encode. Remove "
            "'message' from modality_config in sentence_bert_config.json to serve plain text"
        )
    if task != wanted or modalities != ["text"] or config.get("processing_kwargs"):
        raise UnsupportedModel(
            f"Transformer module (task {task}, modalities {modalities}, processing_kwargs "
            f"{config.get('processing_kwargs')}) is not supported: text {wanted} only"
        )
    return config


def _pooling_modes(config: dict[str, Any], where: str) -> tuple[str, ...]:
    listed = config.get("pooling_mode")
    if listed is None:  # legacy booleans; none set means mean, as ST reads them
        listed = [mode for key, mode in _LEGACY_MODE_KEYS.items() if config.get(key)] or ["mean"]
    return _check_modes([listed] if isinstance(listed, str) else list(listed), where)


def _check_modes(modes: list[str], where: str) -> tuple[str, ...]:
    for mode in modes:
        if mode not in MODES:
            raise UnsupportedModel(f"pooling mode {mode!r} ({where}) is not supported; use {MODES}")
    return tuple(modes)


def _check_normalize(config_file: Path, where: str) -> None:
    config = read_json(config_file)
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise UnsupportedModel(f"Normalize module ({where}) on token rows is not supported")


def score_activation(config: PretrainedConfig, trust_remote_code: bool = False) -> str:
    """The activation `CrossEncoder.predict` applies to a one-label model's logit, as it picks
    it: the model config's `sentence_transformers.activation_fn` (or the older
    `sbert_ce_default_activation_function`) when it is a torch class (any class with
    `trust_remote_code`), else sigmoid (its default for one label). A name of
    `SCORE_ACTIVATIONS`' values, or the class path when it is none of them (not served)."""
    st = getattr(config, "sentence_transformers", None)
    path = st.get("activation_fn") if isinstance(st, dict) else None
    path = str(path or getattr(config, "sbert_ce_default_activation_function", None) or "")
    if not path or not (path.startswith("torch.") or trust_remote_code):
        return "sigmoid"
    return SCORE_ACTIVATIONS.get(path.rsplit(".", 1)[-1], path)
