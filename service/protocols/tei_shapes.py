"""text-embeddings-inference's routes, with TEI's request and answer shapes (the
`components.schemas` of its openapi.json, `tests/specs/tei/openapi.json`) and its semantics
(`router/src/http/server.rs`, `core/src/infer.rs`, `core/src/tokenization.rs`):

- `/embed` (embedding models): one pooled vector per input, L2-normalized unless
  `normalize: false`; `dimensions` cuts, then normalizes.
- `/embed_all` (encoders): each input's token rows (the last hidden state).
- `/embed_sparse` (SPLADE models): per input its non-zero vocabulary weights
  `[{"index", "value"}, ...]`, indices ascending (`service.engine.pooling.sparse`);
  `max_active_dims` (ours,
  sentence-transformers' name) keeps the k largest.
- `encoding_format` on `/embed` (ours, not TEI's): `float`, `base64`, `int8`, `uint8`,
  `binary`, `ubinary` (`service.protocols.encodings`).
- `/predict` (classifiers): per input, every label highest first; scores are the softmax of
  the logits (a one-label model: their sigmoid), or the logits with `raw_scores`.
- `/rerank` (cross-encoders: classifiers with one label): per text, the (query, text) pair's
  sigmoid of the logit (`raw_scores`: the logit), highest first.
- `/similarity` (embedding models): cosine of each sentence to the source sentence.
- `/tokenize`, `/decode` (encoders and classifiers): tokens with id, text, special flag and
  UTF-8 byte span (null for special tokens); the text of each list of token ids.

An input is a string or a list of token ids (used as given: no special tokens are added). A
route the model cannot serve answers 424 naming its task (TEI's status); `/rerank` on a
classifier with several labels too (TEI: "model is not a re-ranker model"). Where we differ
from TEI (docs/api.md, "Where we differ from TEI"): our error statuses and body (an empty input
is 422 where TEI says 400; overload is 503 + Retry-After where TEI says 429), and unknown
fields are refused (422) where TEI ignores them.

This module holds what TEI's routes share: input validators, the request base and the units an
input list makes; each route lives with its task (`service.protocols.<task>.tei`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeGuard, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo

from service.engine.jobs import Op, Unit
from service.engine.params import PairParams, Side, TextParams
from service.errors import InferenceFailed
from service.protocols.schemas import (
    NonBlank,
    TokenId,
    check_list,
    decode,
    inputs_list,
    invalid,
    kind,
    validate,
)
from service.settings import Settings


# -- input validators (messages that name the input; pydantic then checks the types) ---------
def embed_inputs(path: str) -> Callable[[object, ValidationInfo], object]:
    """A validator for TEI's `Input` at `path`: a string, a list of token ids (one input), or a
    list of strings and token-id lists (at most MAX_CLIENT_BATCH_SIZE: 413 past it)."""

    def check(value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            _text(value, path)
        elif isinstance(value, list) and _is_ids(value):
            _ids(value, path)
        elif isinstance(value, list):
            for i, item in enumerate(check_list(value, path, info, "input")):
                at = f"{path}[{i}]"
                if isinstance(item, str):
                    _text(item, at)
                elif isinstance(item, list):
                    _ids(item, at)
                else:
                    raise invalid(f"{at} must be a string or a list of token ids, not {kind(item)}")
        else:
            raise invalid(
                f"{path} must be a string, a list of token ids, or a list of those, "
                f"not {kind(value)}"
            )
        return value

    return check


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(x) for x in value)


def _is_int(x: object) -> TypeGuard[int | float]:
    """An integer, or a JSON number with no fraction (`3.0`: JSON Schema's integer)."""
    if isinstance(x, float):
        return x.is_integer()
    return isinstance(x, int) and not isinstance(x, bool)


def _text(value: str, at: str) -> None:
    if not value.strip():
        raise invalid(f"{at} is empty; send some text")


def _ids(value: Sequence[object], at: str) -> None:
    if not value:
        raise invalid(f"{at} is an empty list; send at least one token id")
    for j, token in enumerate(value):
        if not _is_int(token) or token < 0:
            # Its kind, not the value: a text sent where ids go is a user's input (never
            # echoed nor logged), and the repr of a list nested a thousand deep overflows.
            what = f"the integer {token}" if _is_int(token) else kind(token)
            raise invalid(f"{at}[{j}] must be a token id (an integer >= 0), not {what}")


def _predict_inputs(value: object, info: ValidationInfo) -> object:
    """TEI's `PredictInput`: a string, a pair `[a, b]` (or `[a]`), or a batch of those
    `[[a], [a, b], ...]`."""
    if isinstance(value, str):
        _text(value, "inputs")
    elif isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        _sequence(value, "inputs")
    elif isinstance(value, list):
        for i, item in enumerate(check_list(value, "inputs", info, "input")):
            if not isinstance(item, list) or not all(isinstance(x, str) for x in item):
                raise invalid(
                    f"inputs[{i}] must be a list of one or two strings ([text] or "
                    f"[text, text_pair]), not {kind(item)}"
                )
            _sequence(item, f"inputs[{i}]")
    else:
        raise invalid(
            "inputs must be a string, a pair of strings [text, text_pair], or a batch "
            f"[[text], [text, text_pair], ...], not {kind(value)}"
        )
    return value


def _sequence(value: list[str], at: str) -> None:
    if len(value) > 2:
        raise invalid(
            f"{at} holds {len(value)} strings: send one text or a pair [text, text_pair] "
            "(a batch is a list of those lists)"
        )
    for j, text in enumerate(value):
        _text(text, f"{at}[{j}]")


def _ids_inputs(value: object, info: ValidationInfo) -> object:
    """TEI's `InputIds`: one list of token ids, or a list of them."""
    if _is_ids(value):
        return value
    if not isinstance(value, list):
        raise invalid(f"ids must be a list of token ids or a list of those, not {kind(value)}")
    for i, item in enumerate(check_list(value, "ids", info, "list of token ids")):
        if not isinstance(item, list):
            raise invalid(f"ids[{i}] must be a list of token ids, not {kind(item)}")
        _ids(item, f"ids[{i}]")
    return value


# -- requests ---------------------------------------------------------------------------------
#: TEI accepts both spellings (serde aliases); its spec lists only "Left" and "Right".
Direction = Literal["left", "right", "Left", "Right"]


TokenIds = Annotated[list[TokenId], Field(min_length=1)]


InputType = NonBlank | TokenIds


Input = Annotated[
    InputType | Annotated[list[InputType], inputs_list()], BeforeValidator(embed_inputs("inputs"))
]


PredictSequence = Annotated[list[NonBlank], Field(min_length=1, max_length=2)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _checked_text(value: object, path: str) -> object:
    if isinstance(value, str):
        _text(value, path)
    return value


# -- adapters ---------------------------------------------------------------------------------
R = TypeVar("R", bound=_Request)


def _parsed(model: type[R], body: bytes, content_type: str | None, path: str, s: Settings) -> R:
    doc = decode(body, content_type, raw_text=False)
    return validate(model, doc, what=path, max_inputs=s.max_client_batch_size)


def _direction(value: str | None) -> Side | None:
    """A validated `truncation_direction` ("Left"/"left", "Right"/"right"), as the engine's."""
    return None if value is None else "left" if value.lower() == "left" else "right"


def units(op: Op, inputs: Any, params: TextParams) -> list[Unit]:
    """One unit per input of a validated `Input`: a string or a token-id list, or a list of them."""
    items = inputs if isinstance(inputs, list) and not _is_ids(inputs) else [inputs]
    return [
        Unit(op=op, text=x, params=params)
        if isinstance(x, str)
        else Unit(op=op, ids=tuple(x), params=params)
        for x in items
    ]


def _pair_params(truncate: bool | None, direction: str | None, s: Settings) -> PairParams:
    """Classifier units: TEI truncates a pair longest-first from the chosen side."""
    return PairParams(
        truncate=s.truncate if truncate is None else truncate,
        direction=_direction(direction) or "right",
    )


def scores(logits: npt.ArrayLike, raw: bool) -> npt.NDArray[np.float32]:
    """TEI's scores (`Infer::predict`): the logits with `raw_scores`, else their softmax over
    the labels, or the sigmoid of the one logit of a single-label model; float32, as TEI's
    (computed in float64). Raises 500 for NaN (TEI's "score is NaN")."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if np.isnan(x).any():
        raise InferenceFailed("the model's score for this input is not a number (NaN)")
    if not raw and x.size == 1:
        x = 1.0 / (1.0 + np.exp(-x))
    elif not raw:
        e = np.exp(x - x.max())
        x = e / e.sum()
    return x.astype(np.float32)
