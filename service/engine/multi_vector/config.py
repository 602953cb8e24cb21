"""Reading a sentence-transformers `MultiVectorEncoder` folder, or a PyLate checkpoint as
`MultiVectorEncoder` loads one: what `encode_query` and `encode_document` do with a text, so the
engine can do the same. No torch.

The default composition (sentence-transformers 6, `multi_vector_encoder/model.py`) is
Transformer -> Dense (hidden -> 128, no bias, on `token_embeddings`) -> MultiVectorMask ->
Normalize (on `token_embeddings`). What a folder can carry, and what is served:

- `config_sentence_transformers.json`: `model_type: MultiVectorEncoder`; `prompts` (`query`,
  `document`: served; `encode_query` and `encode_document` never read `default_prompt_name`);
  `similarity_fn_name` (`maxsim`, `meanmaxsim`; any other name is ignored, as the class
  ignores it: MaxSim).
- PyLate checkpoints (`model_type: ColBERT`, `pylate.models.Dense.Dense` modules, the top-level
  `query_prefix`, `document_prefix`, `query_length`, `document_length`, `do_query_expansion`,
  `attend_to_expansion_tokens`, `skiplist_words` keys), read as `MultiVectorEncoder` rewrites
  them on load (`_parse_model_config`, `_apply_legacy_fixups`, `_get_module_init_defaults`):
  each prefix goes before its prompt and is registered as a special token (`prefix_tokens`);
  the lengths and the expansion (`fixed` at `query_length`, 32 where unsaved, unless
  `do_query_expansion` is false) become the Transformer's, its own saved values winning;
  PyLate's Dense is the sentence-transformers Dense on token rows; a `ColBERT` folder gets the
  MultiVectorMask (its `skiplist_words`, else punctuation) and Normalize PyLate applied inline.
- `modules.json`: Transformer -> Dense (any number) -> optional MultiVectorMask -> optional
  Normalize, with one optional HierarchicalTokenPooling after the Dense modules and the mask
  (before or after the Normalize); a Router or any other module: refused, naming the class
  that loads the folder.
- `sentence_bert_config.json`: `query_length`, `document_length`, `max_seq_length`,
  `do_lower_case`, `query_expansion` (`strategy` fixed or min, `attend`, `token`, `length`;
  with a right-padding tokenizer), `unpad_inputs` (how the forward is computed, not what it
  answers): served; a `transformer_task` other than feature-extraction, a `message`
  modality, `processing_kwargs`, or a key sentence-transformers 6 does not write: refused.
- Dense `config.json`: widths, bias, torch activation, residual, on `token_embeddings`.
- MultiVectorMask `config.json`: `skiplist_words`, `skiplist_tasks`, `keep_only_token_ids`.
- Normalize `config.json`: on `token_embeddings`.
- HierarchicalTokenPooling `config.json`: `pool_factor`, `max_tokens`, `distance_threshold`,
  `num_protected_tokens`, `normalize_embeddings` (false where unsaved, as it loads), `tasks`.

A Stanford-NLP ColBERT checkpoint (`HF_ColBERT` in config.json) is refused, naming the
conversion: `MultiVectorEncoder` reads it, and its `save` writes a folder served here.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.engine.folders import TRANSFORMER_KEYS, UnsupportedModel, read_json
from service.engine.pooling.heads import DenseSpec, UnsupportedHead, read_dense
from service.engine.pooling.sentence import SentenceConfig

MODEL_TYPE = "MultiVectorEncoder"
PYLATE_TYPE = "ColBERT"
SIMILARITIES = ("maxsim", "meanmaxsim")
_TOKENS = "token_embeddings"
_KINDS = ("Transformer", "Dense", "MultiVectorMask", "Normalize", "HierarchicalTokenPooling")
#: module classes by the names a folder's modules.json gives them (PyLate's Dense is the
#: sentence-transformers Dense, as `MultiVectorEncoder` aliases it)
_ALIASES = {"pylate.models.Dense.Dense": "Dense"}
_LAYOUT = (
    "Transformer -> Dense (any number) -> optional MultiVectorMask -> optional Normalize, with "
    "one optional HierarchicalTokenPooling after the Dense modules and the mask"
)
_CONVERT = (
    "sentence-transformers' MultiVectorEncoder loads it: MultiVectorEncoder(folder).save(new) "
    "writes the modules its encode applies"
)
# PyLate's top-level keys that `MultiVectorEncoder._parse_model_config` reads.
_PYLATE_KEYS = (
    "query_length",
    "document_length",
    "query_expansion",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "attend_to_mask_tokens",
    "query_prefix",
    "document_prefix",
    "skiplist_words",
)
_EXPANSION_KEYS = {"strategy", "attend", "token", "length"}
_TRANSFORMER_KEYS = TRANSFORMER_KEYS | {"query_length", "document_length", "query_expansion"}
_POOLING_KEYS = {
    "pool_factor",
    "max_tokens",
    "distance_threshold",
    "num_protected_tokens",
    "normalize_embeddings",
    "tasks",
}


@dataclass(frozen=True, kw_only=True)
class QueryExpansion:
    """ColBERT's query expansion: queries shorter than `length` tokens are filled up to it with
    `token` (None: the tokenizer's mask token, else its EOS), which MaxSim scores; `fixed` also
    cuts queries at `length`; `attend`: the encoder attends to the filled positions."""

    strategy: str
    attend: bool
    token: str | None
    length: int


@dataclass(frozen=True, kw_only=True)
class Mask:
    """MultiVectorMask: which token vectors an answer keeps (beyond the real tokens)."""

    skiplist_words: tuple[str, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    keep_only_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class TokenPooling:
    """sentence-transformers' `HierarchicalTokenPooling`: each answer's rows after the first
    `protected_tokens` clustered by Ward linkage on cosine distance into `rows // pool_factor`
    clusters (or at most `max_tokens` rows, or cut at `distance_threshold`), each cluster
    replaced by its mean; `normalize`: the pooled rows L2-normalized. Applies to `tasks`."""

    pool_factor: float = 1.0
    max_tokens: int | None = None
    distance_threshold: float | None = None
    protected_tokens: int = 1
    normalize: bool = True
    tasks: tuple[str, ...] = ("document",)


@dataclass(frozen=True, kw_only=True)
class MultiVectorConfig:
    folder: str
    transformer_path: str = ""
    max_seq_length: int | None = None
    do_lower_case: bool = False
    query_length: int | None = None
    document_length: int | None = None
    expansion: QueryExpansion | None = None
    dense: tuple[DenseSpec, ...] = ()
    mask: Mask | None = None
    normalize: bool = False  # a Normalize before any token pooling
    pooling: TokenPooling | None = None  # the folder's HierarchicalTokenPooling
    normalize_pooled: bool = False  # a Normalize after the token pooling
    prompts: dict[str, str] = field(default_factory=dict)  # query and document ("" if none)
    # PyLate's prefixes, registered on the tokenizer as non-normalized special tokens
    prefix_tokens: tuple[str, ...] = ()
    similarity: str = "maxsim"

    def as_sentence(self) -> SentenceConfig:
        """What the loading reads of a sentence-transformers folder before the weights (where
        the Transformer is, how its tokenizer is set up); no pooling."""
        return SentenceConfig(
            modes=(),
            dimension=0,
            normalize=False,
            max_seq_length=self.max_seq_length,
            do_lower_case=self.do_lower_case,
            prompts=dict(self.prompts),
            transformer_path=self.transformer_path,
            folder=self.folder,
        )

    def modules(self) -> tuple[str, ...]:
        """The module chain for /info, e.g. `("Transformer", "Dense(32->8, Identity)",
        "MultiVectorMask", "Normalize")`."""
        out = ["Transformer"]
        for d in self.dense:
            out.append(f"Dense({d.in_features}->{d.out_features}, {d.activation.rsplit('.')[-1]})")
        pooling = self.pooling
        pooled = () if pooling is None else (f"HierarchicalTokenPooling({pooling.pool_factor:g})",)
        return (
            *out,
            *(("MultiVectorMask",) if self.mask else ()),
            *(("Normalize",) * self.normalize),
            *pooled,
            *(("Normalize",) * self.normalize_pooled),
        )


def is_multi_vector(folder: Path) -> bool:
    """The folder was saved by a MultiVectorEncoder or by PyLate, or is a Stanford-NLP ColBERT
    checkpoint (refused when read, naming the conversion)."""
    if _stanford(folder):
        return True
    st_file = folder / "config_sentence_transformers.json"
    if not (folder / "modules.json").is_file() or not st_file.is_file():
        return False
    model_type = read_json(st_file).get("model_type")
    return model_type in (MODEL_TYPE, PYLATE_TYPE)


def _stanford(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and "HF_ColBERT" in (read_json(config).get("architectures") or [])


def read_multi_vector_config(folder: Path) -> MultiVectorConfig:
    """The folder's multi-vector configuration; raises `UnsupportedModel` naming the first
    option it carries that is not served (see the module docstring)."""
    if _stanford(folder) and not (folder / "modules.json").is_file():
        raise UnsupportedModel(
            f"a Stanford-NLP ColBERT checkpoint (HF_ColBERT) is not served as is: {_CONVERT}"
        )
    model = read_json(folder / "config_sentence_transformers.json")
    legacy = _Legacy.read(model)
    entries = read_json(folder / "modules.json")
    modules = [(_module_kind(e), str(e.get("path", ""))) for e in entries]
    if legacy.pylate and all(k in ("Transformer", "Dense") for k, _ in modules):
        # PyLate applied the mask and the normalization inline; MultiVectorEncoder appends them
        modules += [("MultiVectorMask", ""), ("Normalize", "")]
    kinds = [k for k, _ in modules]
    _check_layout(kinds)
    transformer = {**legacy.transformer, **_transformer(folder / modules[0][1])}
    dense: list[DenseSpec] = []
    mask, pooling, normalize = None, None, [False, False]
    for kind, path in modules[1:]:
        if kind == "Dense":
            try:
                dense.append(read_dense(folder, path, level=_TOKENS))
            except UnsupportedHead as exc:
                raise UnsupportedModel(str(exc)) from None
        elif kind == "MultiVectorMask":
            mask = _mask(folder / path / "config.json") if path else legacy.mask()
        elif kind == "HierarchicalTokenPooling":
            pooling = _pooling(folder / path / "config.json")
        elif kind == "Normalize":
            config = read_json(folder / path / "config.json") if path else {}
            if config.get("module_input_name", _TOKENS) != _TOKENS:
                raise UnsupportedModel(f"Normalize module ({path}) not on token_embeddings")
            normalize[pooling is not None] = True
    similarity = model.get("similarity_fn_name")
    return MultiVectorConfig(
        folder=str(folder),
        transformer_path=modules[0][1],
        max_seq_length=transformer.get("max_seq_length"),
        do_lower_case=bool(transformer.get("do_lower_case", False)),
        query_length=transformer.get("query_length"),
        document_length=transformer.get("document_length"),
        expansion=_expansion(transformer.get("query_expansion")),
        dense=tuple(dense),
        mask=mask,
        normalize=normalize[0],
        pooling=pooling,
        normalize_pooled=normalize[1],
        prompts=legacy.prompts,
        prefix_tokens=legacy.prefix_tokens,
        similarity=similarity if similarity in SIMILARITIES else "maxsim",
    )


@dataclass(frozen=True, kw_only=True)
class _Legacy:
    """What `MultiVectorEncoder._parse_model_config` makes of config_sentence_transformers.json:
    the prompts (PyLate's prefixes before them), the Transformer options its top-level keys
    give (the Transformer's own saved options win), the skiplist of the mask it appends."""

    pylate: bool
    prompts: dict[str, str]
    prefix_tokens: tuple[str, ...]
    transformer: dict[str, Any]
    skiplist_words: tuple[str, ...] | None

    @classmethod
    def read(cls, model: dict[str, Any]) -> _Legacy:
        model_type = model.get("model_type")
        if model_type not in (MODEL_TYPE, PYLATE_TYPE):
            raise UnsupportedModel(f"a {model_type} folder is not a multi-vector model: {_CONVERT}")
        saved = {str(k): str(v or "") for k, v in (model.get("prompts") or {}).items()}
        prompts = {"query": saved.get("query", ""), "document": saved.get("document", "")}
        prefixes = []
        for key, task in (("query_prefix", "query"), ("document_prefix", "document")):
            if key in model:
                prefix = str(model[key] or "")
                prefixes.append(prefix)
                prompts[task] = prefix + prompts[task].removeprefix(prefix)
        knobs: dict[str, Any] = {
            k: model[k]
            for k in ("query_length", "document_length", "query_expansion")
            if k in model and (model[k] is not None or k == "query_expansion")
        }
        if "query_expansion" not in knobs and any(k in model for k in _PYLATE_KEYS):
            if model.get("do_query_expansion") is False:
                knobs["query_expansion"] = None
            else:
                attend = model.get("attend_to_expansion_tokens", model.get("attend_to_mask_tokens"))
                length = knobs.pop("query_length", None) or model.get("query_length") or 32
                knobs["query_expansion"] = {
                    "strategy": "fixed",
                    "attend": bool(attend),
                    "length": length,
                }
        words = model.get("skiplist_words")
        return cls(
            pylate=model_type == PYLATE_TYPE,
            prompts=prompts,
            prefix_tokens=tuple(p for p in prefixes if p.split()),
            transformer=knobs,
            skiplist_words=None if words is None else tuple(str(w) for w in words),
        )

    def mask(self) -> Mask:
        """The MultiVectorMask appended to a PyLate folder: its skiplist, else punctuation."""
        words = self.skiplist_words
        return Mask(skiplist_words=tuple(string.punctuation) if words is None else words)


def _module_kind(entry: Mapping[str, object]) -> str:
    """The class name of a modules.json entry if it is one this server applies, else
    `UnsupportedModel` naming it and the class that loads the folder."""
    ref = str(entry.get("type", ""))
    kind = _ALIASES.get(ref) or ref.rsplit(".", 1)[-1]
    if (ref.startswith("sentence_transformers.") or ref in _ALIASES) and kind in _KINDS:
        return kind
    where = entry.get("path") or "the model folder"
    raise UnsupportedModel(
        f"module {ref} (in {where}) is not supported by this server in a multi-vector model: "
        f"it serves {_LAYOUT}; sentence-transformers' MultiVectorEncoder loads the folder with "
        "that module in Python"
    )


def _check_layout(kinds: list[str]) -> None:
    """Transformer, then Dense modules, then an optional Normalize; one MultiVectorMask may
    stand anywhere after the Transformer (it only rewrites which tokens are kept); one
    HierarchicalTokenPooling after every Dense and the mask, before or after the Normalize."""
    rest = [k for k in kinds[1:] if k != "MultiVectorMask"]
    pool = "HierarchicalTokenPooling"
    if pool in rest:
        at = rest.index(pool)
        mask = "MultiVectorMask"
        mask_before = mask not in kinds or kinds.index(mask) < kinds.index(pool)
        after = rest[at + 1 :]
        twice = "Normalize" in rest[:at] and bool(after)
        if not mask_before or after not in ([], ["Normalize"]) or twice:
            rest = ["misplaced"]
        else:
            rest = rest[:at]
    if rest[-1:] == ["Normalize"]:
        rest = rest[:-1]
    one_mask = kinds.count("MultiVectorMask") <= 1
    if kinds[:1] == ["Transformer"] and one_mask and all(k == "Dense" for k in rest):
        return
    raise UnsupportedModel(f"modules.json lists {' -> '.join(kinds)}: only {_LAYOUT} is supported")


def _pooling(config_file: Path) -> TokenPooling:
    """The HierarchicalTokenPooling's options, as `load_config` reads them (no
    `normalize_embeddings`: false)."""
    config = read_json(config_file) if config_file.is_file() else {}
    unknown = sorted(set(config) - _POOLING_KEYS)
    if unknown:
        raise UnsupportedModel(f"HierarchicalTokenPooling option(s) {unknown} are not supported")
    factor = float(config.get("pool_factor", 1.0))
    protected = config.get("num_protected_tokens", 1)
    threshold = config.get("distance_threshold")
    tasks = config.get("tasks")
    tasks = ["document"] if tasks is None else [tasks] if isinstance(tasks, str) else tasks
    if not math.isfinite(factor) or factor < 1 or not isinstance(protected, int) or protected < 0:
        raise UnsupportedModel(
            f"HierarchicalTokenPooling pool_factor {factor} / num_protected_tokens {protected} "
            "out of range (pool_factor >= 1, num_protected_tokens >= 0)"
        )
    return TokenPooling(
        pool_factor=factor,
        max_tokens=config.get("max_tokens"),
        distance_threshold=None if threshold is None else float(threshold),
        protected_tokens=protected,
        normalize=bool(config.get("normalize_embeddings", False)),
        tasks=tuple(str(t) for t in tasks),
    )


def _transformer(folder: Path) -> dict[str, Any]:
    """The Transformer module's `sentence_bert_config.json`, checked: text feature-extraction,
    no `processing_kwargs`, the keys sentence-transformers 6 writes."""
    config: dict[str, Any] = read_json(folder / "sentence_bert_config.json")
    unknown = sorted(set(config) - _TRANSFORMER_KEYS)
    task = config.get("transformer_task", "feature-extraction")
    modalities = sorted(config.get("modality_config") or {"text": None})
    if unknown or task != "feature-extraction" or modalities != ["text"]:
        raise UnsupportedModel(
            f"Transformer module (task {task}, modalities {modalities}, keys {unknown or 'known'}) "
            "is not supported in a multi-vector model: text feature-extraction only"
        )
    if config.get("processing_kwargs"):
        raise UnsupportedModel(
            f"Transformer module's processing_kwargs {config['processing_kwargs']} are not "
            "supported: the server tokenizes as sentence-transformers does without them"
        )
    if config.get("module_output_name", _TOKENS) != _TOKENS:
        raise UnsupportedModel("Transformer module must write token_embeddings")
    return config


def _expansion(value: Any) -> QueryExpansion | None:
    if value is None:
        return None
    strategy, length = value.get("strategy"), value.get("length")
    if (
        not isinstance(value, dict)
        or set(value) - _EXPANSION_KEYS
        or strategy not in ("fixed", "min")
        or not isinstance(length, int)
        or length < 1
    ):
        raise UnsupportedModel(f"query_expansion {value} is not supported (strategy fixed or min)")
    return QueryExpansion(
        strategy=strategy,
        attend=bool(value.get("attend", False)),
        token=value.get("token"),
        length=length,
    )


def _mask(config_file: Path) -> Mask:
    config = read_json(config_file)
    unknown = sorted(set(config) - {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"})
    if unknown:
        raise UnsupportedModel(f"MultiVectorMask option(s) {unknown} are not supported")
    tasks = config.get("skiplist_tasks")
    tasks = ["document"] if tasks is None else tasks
    keep = config.get("keep_only_token_ids")
    return Mask(
        skiplist_words=tuple(str(w) for w in config.get("skiplist_words") or ()),
        skiplist_tasks=tuple([tasks] if isinstance(tasks, str) else tasks),
        keep_only_token_ids=None if keep is None else tuple(int(i) for i in keep),
    )
