"""What every model family's folder reader shares: sentence-transformers' `modules.json` entries,
the Transformer module's keys, reading a JSON file, and the error for a folder this server cannot
serve (`UnsupportedModel`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The Transformer module keys (`sentence_bert_config.json`) sentence-transformers 6 writes
#: for any model; the multi-vector and causal-LM reranker readers accept these and their own.
TRANSFORMER_KEYS = frozenset(
    {
        "transformer_task",
        "modality_config",
        "module_output_name",
        "processing_kwargs",
        "unpad_inputs",
        "max_seq_length",
        "do_lower_case",
    }
)


class UnsupportedModel(ValueError):
    """A sentence-transformers folder whose embeddings this server cannot reproduce."""


@dataclass(frozen=True, kw_only=True)
class Module:
    """One entry of modules.json: its class name (`Pooling`) and folder (`1_Pooling`)."""

    kind: str
    path: str


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_json(path: Path) -> Any:
    """The JSON document in `path`; {} when there is no such file."""
    return _read_json(path) if path.is_file() else {}


def module_kind(entry: dict[str, Any], known: tuple[str, ...], model: str = "") -> str:
    """The class name of a modules.json `entry` (`Pooling`) if it is a sentence-transformers
    module in `known`, else `UnsupportedModel` naming it; `model` ends that message (" in a
    multi-vector model")."""
    ref = str(entry.get("type", ""))
    kind = ref.rsplit(".", 1)[-1]
    if ref.startswith("sentence_transformers.") and kind in known:
        return kind
    where = entry.get("path") or "the model folder"
    raise UnsupportedModel(f"module {ref} (in {where}) is not supported by this server{model}")


#: `CrossEncoder` activations we apply to a logit, by torch class name.
SCORE_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Tanh": "tanh"}


#: A BGE-M3 folder's heads beside its encoder (FlagEmbedding's `BGEM3FlagModel` layout):
#: the multi-vector head, then the lexical (sparse) head.
M3_HEADS = ("colbert_linear.pt", "sparse_linear.pt")


def is_m3(folder: Path) -> bool:
    """`folder` holds a BGE-M3 model: both of `M3_HEADS` beside its encoder. One without the
    other is refused (`UnsupportedModel`): FlagEmbedding loads both or neither, and without
    them it makes random heads."""
    found = [name for name in M3_HEADS if (folder / name).is_file()]
    if len(found) == 1:
        missing = next(name for name in M3_HEADS if name not in found)
        raise UnsupportedModel(
            f"{found[0]} without {missing}: a BGE-M3 folder carries both of {list(M3_HEADS)}"
        )
    return len(found) == 2
