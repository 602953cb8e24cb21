"""text-embeddings-inference's routes, with TEI's request and answer shapes (the
`components.schemas` of its openapi.json, `tests/specs/tei/openapi.json`) and its semantics
(`router/src/http/server.rs`, `core/src/infer.rs`, `core/src/tokenization.rs`):

- `/embed` (embedding models): one pooled vector per input, L2-normalized unless
  `normalize: false`; `dimensions` cuts, then normalizes.
- `/embed_all` (encoders): each input's token rows (the last hidden state).
- `/embed_sparse` (SPLADE models): per input its non-zero vocabulary weights
  `[{"index", "value"}, ...]`, indices ascending (`service.engine.sparse`); `max_active_dims` (ours,
  sentence-transformers' name) keeps the k largest.
- `encoding_format` on `/embed` (ours, not TEI's): `float`, `base64`, `binary`, `ubinary`
  (`service.protocols.encodings`).
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
from TEI (README, "TEI and OpenAI compatibility"): our error statuses and body (an empty input
is 422 where TEI says 400; overload is 503 + Retry-After where TEI says 429), and unknown
fields are refused (422) where TEI ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, RootModel, ValidationInfo

from service.engine.jobs import Job, Op, Unit
from service.engine.model import ModelInfo
from service.errors import InferenceFailed, PayloadTooLarge, WrongTask
from service.protocols.encodings import Encoding, encode_all
from service.protocols.hf import (
    SimilarityInputs,
    Texts,
    cosine_to_first,
    dimension_warning,
    embedding_params,
)
from service.protocols.schemas import (
    INTEGRAL,
    Dimensions,
    NonBlank,
    PromptName,
    TokenId,
    check_list,
    decode,
    inputs_list,
    invalid,
    kind,
    validate,
)
from service.protocols.schemas import texts as text_inputs
from service.protocols.serving import Endpoint, needs, require
from service.settings import Settings


# -- input validators (messages that name the input; pydantic then checks the types) ---------
def embed_inputs(path: str) -> Any:
    """A validator for TEI's `Input` at `path`: a string, a list of token ids (one input), or a
    list of strings and token-id lists (at most MAX_CLIENT_BATCH_SIZE: 413 past it)."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            _text(value, path)
        elif _is_ids(value):
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


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(x) for x in value)


def _is_int(x: Any) -> bool:
    """An integer, or a JSON number with no fraction (`3.0`: JSON Schema's integer)."""
    if isinstance(x, float):
        return x.is_integer()
    return isinstance(x, int) and not isinstance(x, bool)


def _text(value: str, at: str) -> None:
    if not value.strip():
        raise invalid(f"{at} is empty; send some text")


def _ids(value: list[Any], at: str) -> None:
    if not value:
        raise invalid(f"{at} is an empty list; send at least one token id")
    for j, token in enumerate(value):
        if not _is_int(token) or token < 0:
            raise invalid(f"{at}[{j}] must be a token id (an integer >= 0), not {token!r}")


def _predict_inputs(value: Any, info: ValidationInfo) -> Any:
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


def _ids_inputs(value: Any, info: ValidationInfo) -> Any:
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
class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


#: TEI accepts both spellings (serde aliases); its spec lists only "Left" and "Right".
Direction = Literal["left", "right", "Left", "Right"]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
InputType = NonBlank | TokenIds

Input = Annotated[
    InputType | Annotated[list[InputType], inputs_list()], BeforeValidator(embed_inputs("inputs"))
]
PredictSequence = Annotated[list[NonBlank], Field(min_length=1, max_length=2)]


class EmbedRequest(_Request):
    inputs: Input
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None
    dimensions: Dimensions | None = None
    encoding_format: Encoding | None = Field(
        None, description="ours: float (default), base64, binary or ubinary"
    )


class EmbedSparseRequest(_Request):
    inputs: Input
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None
    max_active_dims: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        None, description="ours: keep the k largest weights (sentence-transformers' name)"
    )


class EmbedAllRequest(_Request):
    inputs: Input
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None


class PredictRequest(_Request):
    inputs: Annotated[
        NonBlank | PredictSequence | Annotated[list[PredictSequence], inputs_list()],
        BeforeValidator(_predict_inputs),
    ]
    raw_scores: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None


class RerankRequest(_Request):
    query: Annotated[NonBlank, BeforeValidator(lambda v: _checked_text(v, "query"))]
    texts: Annotated[list[NonBlank], inputs_list(), BeforeValidator(text_inputs("texts"))]
    raw_scores: bool | None = None
    return_text: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None


def _checked_text(value: Any, path: str) -> Any:
    if isinstance(value, str):
        _text(value, path)
    return value


class SimilarityParameters(_Request):
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None


class SimilarityRequest(_Request):
    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None


class TokenizeRequest(_Request):
    inputs: Texts
    add_special_tokens: bool | None = None
    prompt_name: PromptName | None = None


class DecodeRequest(_Request):
    ids: Annotated[
        TokenIds | Annotated[list[TokenIds], inputs_list()], BeforeValidator(_ids_inputs)
    ]
    skip_special_tokens: bool | None = None


# -- answers (for /openapi.json; the routes build them as plain JSON) -------------------------
class EmbedResponse(RootModel[list[list[float]] | list[str] | list[list[int]]]):
    """One vector per input (a single input: a list holding one), as `encoding_format` asks."""


class SparseValue(BaseModel):
    index: int = Field(ge=0)
    value: float


class EmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """Per input, its non-zero weights by vocabulary index, ascending."""


class EmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input, one row per token."""


class Prediction(BaseModel):
    score: float
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """A single input: its labels, highest first; a batch: one such list per input."""


class Rank(BaseModel):
    index: int = Field(ge=0)
    score: float
    text: str | None = Field(None, description="only with return_text")


class RerankResponse(RootModel[list[Rank]]):
    """Every text, highest score first; `index` is its position in `texts`."""


class SimilarityResponse(RootModel[list[float]]):
    """Cosine similarity of each sentence to the source sentence, in order."""


class SimpleToken(BaseModel):
    id: int = Field(ge=0)
    text: str
    special: bool
    start: int | None = Field(ge=0, description="UTF-8 byte offset; null for special tokens")
    stop: int | None = Field(ge=0, description="UTF-8 byte offset; null for special tokens")


class TokenizeResponse(RootModel[list[list[SimpleToken]]]):
    """One list of tokens per input (a single input: a list holding one)."""


class DecodeResponse(RootModel[list[str]]):
    """One text per list of ids (a single list: a list holding one)."""


# -- adapters ---------------------------------------------------------------------------------
def _parsed(
    model: type[_Request], body: bytes, content_type: str | None, path: str, s: Settings
) -> Any:
    doc = decode(body, content_type, raw_text=False)
    return validate(model, doc, what=path, max_inputs=s.max_client_batch_size)


def _direction(value: str | None) -> str | None:
    return None if value is None else value.lower()


def units(op: Op, inputs: Any, params: dict[str, Any]) -> list[Unit]:
    """One unit per input of a validated `Input`: a string or a token-id list, or a list of them."""
    items = inputs if isinstance(inputs, list) and not _is_ids(inputs) else [inputs]
    return [
        Unit(op=op, text=x, params=params)
        if isinstance(x, str)
        else Unit(op=op, ids=tuple(x), params=params)
        for x in items
    ]


def _embed(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedRequest = _parsed(EmbedRequest, body, content_type, "/embed", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        normalize=r.normalize,
        dimensions=r.dimensions,
        default_truncate=s.truncate,
    )
    fmt = r.encoding_format
    headers = dimension_warning(info, r.dimensions)
    return Job(units(Op.EMBED, r.inputs, params), lambda a: encode_all(a, fmt), headers=headers)


def _embed_sparse(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedSparseRequest = _parsed(EmbedSparseRequest, body, content_type, "/embed_sparse", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        default_truncate=s.truncate,
    )
    params["max_active_dims"] = r.max_active_dims
    return Job(units(Op.SPARSE, r.inputs, params), lambda a: [v.pairs() for v in a])


def _embed_all(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedAllRequest = _parsed(EmbedAllRequest, body, content_type, "/embed_all", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        default_truncate=s.truncate,
    )
    return Job(units(Op.ROWS, r.inputs, params))


def _predict(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: PredictRequest = _parsed(PredictRequest, body, content_type, "/predict", s)
    batch = isinstance(r.inputs, list) and isinstance(r.inputs[0], list)
    sequences: list[Any] = list(r.inputs) if batch else [r.inputs]
    params = _pair_params(r.truncate, r.truncation_direction, s)
    jobs = []
    for seq in sequences:
        if isinstance(seq, str):
            jobs.append(Unit(op=Op.LOGITS, text=seq, params=params))
        else:
            pair = seq[1] if len(seq) == 2 else None
            jobs.append(Unit(op=Op.LOGITS, text=seq[0], pair=pair, params=params))
    raw = bool(r.raw_scores)

    def finish(logits: list[Any]) -> Any:
        answers = [predictions(x, info.labels, raw) for x in logits]
        return answers if batch else answers[0]

    return Job(jobs, finish)


def _pair_params(truncate: bool | None, direction: str | None, s: Settings) -> dict[str, Any]:
    """Classifier units: TEI truncates a pair longest-first from the chosen side."""
    return {
        "truncate": s.truncate if truncate is None else truncate,
        "direction": _direction(direction) or "right",
    }


def scores(logits: Any, raw: bool) -> np.ndarray:
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


def predictions(logits: Any, labels: Sequence[str], raw: bool) -> list[dict[str, Any]]:
    """Every label's score, highest first (ties: in label order)."""
    values = scores(logits, raw)
    order = sorted(range(values.size), key=lambda i: (-values[i], i))
    return [{"score": values[i], "label": labels[i]} for i in order]


def reranker(info: ModelInfo) -> None:
    """`/rerank` needs a cross-encoder: a sequence classifier with one label (TEI's reranker)."""
    require(info, Op.LOGITS, "/rerank")
    if len(info.labels) != 1:
        raise WrongTask(
            "/rerank needs a cross-encoder (a text-classification model with one label); "
            f"this model has {len(info.labels)} labels ({', '.join(info.labels)}): "
            "use /predict for its scores"
        )


def _rerank(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: RerankRequest = _parsed(RerankRequest, body, content_type, "/rerank", s)
    params = _pair_params(r.truncate, r.truncation_direction, s)
    jobs = [Unit(op=Op.LOGITS, text=r.query, pair=t, params=params) for t in r.texts]
    raw, with_text = bool(r.raw_scores), bool(r.return_text)

    def finish(logits: list[Any]) -> Any:
        values = [scores(x, raw)[0] for x in logits]
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))
        ranks = []
        for i in order:
            rank: dict[str, Any] = {"index": i, "score": values[i]}
            if with_text:
                rank["text"] = r.texts[i]
            ranks.append(rank)
        return ranks

    return Job(jobs, finish)


def _similarity(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: SimilarityRequest = _parsed(SimilarityRequest, body, content_type, "/similarity", s)
    p = r.parameters or SimilarityParameters()
    texts = [r.inputs.source_sentence, *r.inputs.sentences]
    if len(texts) > s.max_client_batch_size:  # the source sentence counts (TEI's too)
        raise PayloadTooLarge(
            f"{len(texts)} inputs in one request (the source sentence and {len(texts) - 1} "
            f"sentences); at most {s.max_client_batch_size} (MAX_CLIENT_BATCH_SIZE)"
        )
    params = embedding_params(
        info,
        truncate=p.truncate,
        direction=_direction(p.truncation_direction),
        prompt_name=p.prompt_name,
        default_truncate=s.truncate,
    )
    return Job([Unit(op=Op.EMBED, text=t, params=params) for t in texts], cosine_to_first)


def _tokenize(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: TokenizeRequest = _parsed(TokenizeRequest, body, content_type, "/tokenize", s)
    prompt = embedding_params(info, truncate=None, direction=None, prompt_name=r.prompt_name)
    params = {
        "add_special_tokens": r.add_special_tokens is not False,
        "prompt_name": prompt["prompt_name"],
    }
    return Job(units(Op.TOKENIZE, r.inputs, params))


def _decode(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: DecodeRequest = _parsed(DecodeRequest, body, content_type, "/decode", s)
    lists: list[Any] = [r.ids] if _is_ids(r.ids) else list(r.ids)
    params = {"skip_special_tokens": r.skip_special_tokens is not False}
    return Job([Unit(op=Op.DECODE, ids=tuple(ids), params=params) for ids in lists])


ENDPOINTS = (
    Endpoint(
        path="/embed",
        summary="Sentence embeddings (TEI)",
        parse=_embed,
        check=needs(Op.EMBED, "/embed"),
        request=EmbedRequest,
        response=EmbedResponse,
    ),
    Endpoint(
        path="/embed_sparse",
        summary="Sparse (SPLADE) embeddings (TEI)",
        parse=_embed_sparse,
        check=needs(Op.SPARSE, "/embed_sparse"),
        request=EmbedSparseRequest,
        response=EmbedSparseResponse,
    ),
    Endpoint(
        path="/embed_all",
        summary="Token embeddings, unpooled (TEI)",
        parse=_embed_all,
        check=needs(Op.ROWS, "/embed_all"),
        request=EmbedAllRequest,
        response=EmbedAllResponse,
    ),
    Endpoint(
        path="/predict",
        summary="Sequence classification scores (TEI)",
        parse=_predict,
        check=needs(Op.LOGITS, "/predict"),
        request=PredictRequest,
        response=PredictResponse,
    ),
    Endpoint(
        path="/rerank",
        summary="Rerank texts against a query with a cross-encoder (TEI)",
        parse=_rerank,
        check=reranker,
        request=RerankRequest,
        response=RerankResponse,
    ),
    Endpoint(
        path="/similarity",
        summary="Cosine similarity of sentences to a source sentence (TEI)",
        parse=_similarity,
        check=needs(Op.EMBED, "/similarity"),
        request=SimilarityRequest,
        response=SimilarityResponse,
    ),
    Endpoint(
        path="/tokenize",
        summary="Tokenize inputs (TEI)",
        parse=_tokenize,
        check=needs(Op.TOKENIZE, "/tokenize"),
        request=TokenizeRequest,
        response=TokenizeResponse,
    ),
    Endpoint(
        path="/decode",
        summary="Decode token ids (TEI)",
        parse=_decode,
        check=needs(Op.DECODE, "/decode"),
        request=DecodeRequest,
        response=DecodeResponse,
    ),
)
