"""Reading a sentence-transformers `MultiVectorEncoder` folder: what `encode_query` and
`encode_document` do with a text, so the engine can do the same. No torch.

The default composition (sentence-transformers 6, `multi_vector_encoder/model.py`) is
Transformer -> Dense (hidden -> 128, no bias, on `token_embeddings`) -> MultiVectorMask ->
Normalize (on `token_embeddings`). What a folder can carry, and what is served:

- `config_sentence_transformers.json`: `model_type: MultiVectorEncoder` (PyLate 3's `ColBERT`,
  and the top-level `query_prefix`, `document_length`, ... keys that sentence-transformers
  rewrites on load: refused); `prompts` (`query`, `document`: served; `encode_query` and
  `encode_document` never read `default_prompt_name`); `similarity_fn_name` (`maxsim`,
  `meanmaxsim`; any other name is ignored, as the class ignores it: MaxSim).
- `modules.json`: Transformer -> Dense (any number) -> optional Normalize, one optional
  MultiVectorMask anywhere after the Transformer; token pooling modules (`*TokenPooling`), a
  Router or any other module: refused.
- `sentence_bert_config.json`: `query_length`, `document_length`, `max_seq_length`,
  `do_lower_case`, `query_expansion` (`strategy` fixed or min, `attend`, `token`, `length`;
  with a right-padding tokenizer), `unpad_inputs` (how the forward is computed, not what it
  answers): served; a `transformer_task` other than feature-extraction, a `message`
  modality, `processing_kwargs`, or a key sentence-transformers 6 does not write: refused.
- Dense `config.json`: widths, bias, torch activation, residual, on `token_embeddings`.
- MultiVectorMask `config.json`: `skiplist_words`, `skiplist_tasks`, `keep_only_token_ids`.
- Normalize `config.json`: on `token_embeddings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.engine.folders import TRANSFORMER_KEYS, UnsupportedModel, module_kind, read_json
from service.engine.pooling.heads import DenseSpec, UnsupportedHead, read_dense
from service.engine.pooling.sentence import SentenceConfig

MODEL_TYPE = "MultiVectorEncoder"
SIMILARITIES = ("maxsim", "meanmaxsim")
_TOKENS = "token_embeddings"
_KINDS = ("Transformer", "Dense", "MultiVectorMask", "Normalize")
_LAYOUT = "Transformer -> Dense (any number) -> optional MultiVectorMask -> optional Normalize"
# PyLate <= 3 and Stanford ColBERT keys that sentence-transformers rewrites on load (prefix
# tokens registered as special tokens, expansion rebuilt): not served, so refused by name.
_LEGACY_KEYS = (
    "query_prefix",
    "document_prefix",
    "query_length",
    "document_length",
    "query_expansion",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "skiplist_words",
)
_EXPANSION_KEYS = {"strategy", "attend", "token", "length"}
_TRANSFORMER_KEYS = TRANSFORMER_KEYS | {"query_length", "document_length", "query_expansion"}


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
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)  # query and document ("" if none)
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
        return (
            *out,
            *(("MultiVectorMask",) if self.mask else ()),
            *(("Normalize",) * self.normalize),
        )


def is_multi_vector(folder: Path) -> bool:
    """The folder was saved by a MultiVectorEncoder (or PyLate 3, refused when read)."""
    st_file = folder / "config_sentence_transformers.json"
    if not (folder / "modules.json").is_file() or not st_file.is_file():
        return False
    model_type = read_json(st_file).get("model_type")
    return model_type in (MODEL_TYPE, "ColBERT")


def read_multi_vector_config(folder: Path) -> MultiVectorConfig:
    """The folder's multi-vector configuration; raises `UnsupportedModel` naming the first
    option it carries that is not served (see the module docstring)."""
    model = read_json(folder / "config_sentence_transformers.json")
    if model.get("model_type") != MODEL_TYPE:
        raise UnsupportedModel(
            f"a {model.get('model_type')} (PyLate 3) folder is not supported: load it with "
            "sentence-transformers' MultiVectorEncoder and save it again to serve it"
        )
    legacy = [key for key in _LEGACY_KEYS if key in model]
    if legacy:
        raise UnsupportedModel(
            f"config_sentence_transformers.json carries PyLate/ColBERT keys {legacy}: load the "
            "folder with sentence-transformers' MultiVectorEncoder and save it again to serve it"
        )
    entries = read_json(folder / "modules.json")
    modules = [
        (module_kind(e, _KINDS, " in a multi-vector model"), str(e.get("path", "")))
        for e in entries
    ]
    kinds = [k for k, _ in modules]
    _check_layout(kinds)
    transformer = _transformer(folder / modules[0][1])
    dense: list[DenseSpec] = []
    mask = None
    for kind, path in modules[1:]:
        if kind == "Dense":
            try:
                dense.append(read_dense(folder, path, level=_TOKENS))
            except UnsupportedHead as exc:
                raise UnsupportedModel(str(exc)) from None
        elif kind == "MultiVectorMask":
            mask = _mask(folder / path / "config.json")
        elif kind == "Normalize":
            config = read_json(folder / path / "config.json") if path else {}
            if config.get("module_input_name", "sentence_embedding") != _TOKENS:
                raise UnsupportedModel(f"Normalize module ({path}) not on token_embeddings")
    prompts = {str(k): str(v or "") for k, v in (model.get("prompts") or {}).items()}
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
        normalize=kinds[-1] == "Normalize",
        prompts={"query": prompts.get("query", ""), "document": prompts.get("document", "")},
        similarity=similarity if similarity in SIMILARITIES else "maxsim",
    )


def _check_layout(kinds: list[str]) -> None:
    """Transformer, then Dense modules, then an optional Normalize; one MultiVectorMask may
    stand anywhere after the Transformer (it only rewrites which tokens are kept)."""
    rest = [k for k in kinds[1:] if k != "MultiVectorMask"]
    if rest[-1:] == ["Normalize"]:
        rest = rest[:-1]
    one_mask = kinds.count("MultiVectorMask") <= 1
    if kinds[:1] == ["Transformer"] and one_mask and all(k == "Dense" for k in rest):
        return
    raise UnsupportedModel(f"modules.json lists {' -> '.join(kinds)}: only {_LAYOUT} is supported")


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
