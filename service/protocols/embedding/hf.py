"""The Inference API's feature-extraction and sentence-similarity tasks on `POST /`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.errors import InvalidInput, PayloadTooLarge
from service.protocols.embedding.common import (
    SimilarityInputs,
    _sentences,
    cosine_to_first,
    dimension_warning,
    embedding_params,
)
from service.protocols.encodings import EncodingField, encode_all
from service.protocols.hf_shapes import _as_list, _is_list, _Request, list_paths
from service.protocols.params import (
    FeatureExtractionParams,
    SentenceSimilarityParams,
)
from service.protocols.schemas import (
    Dimensions,
    Normalize,
    PromptName,
    Texts,
)
from service.protocols.serving import require
from service.settings import Settings


class FeatureExtractionRequest(_Request):
    inputs: Texts
    normalize: Normalize | None = None
    prompt_name: PromptName | None = None
    truncate: bool | None = None
    truncation_direction: Literal["left", "right"] | None = None
    dimensions: Dimensions | None = None
    encoding_format: EncodingField | None = None
    parameters: FeatureExtractionParams | None = None


class SentenceSimilarityRequest(_Request):
    inputs: Annotated[SimilarityInputs, BeforeValidator(_sentences)]
    parameters: SentenceSimilarityParams | None = None


def _feature_extraction(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, FeatureExtractionRequest)
    fields = _merged(request)
    op = info.output.op  # EMBED, SPARSE or ROWS
    if op is Op.ROWS and (
        fields.normalize is not None
        or fields.dimensions
        or request.encoding_format not in (None, "float")
    ):
        raise InvalidInput(
            "this model answers token rows (it has no sentence-transformers pooling config): "
            "normalize, dimensions and encoding_format need pooled embeddings; set POOLING to "
            "pool its rows"
        )
    if op is Op.SPARSE and (fields.normalize is not None or fields.dimensions):
        raise InvalidInput(
            "this model answers sparse (SPLADE) embeddings: normalize and dimensions apply to "
            "dense embeddings only"
        )
    params = embedding_params(
        info,
        truncate=fields.truncate,
        direction=fields.truncation_direction,
        prompt_name=fields.prompt_name,
        normalize=fields.normalize,
        dimensions=fields.dimensions,
        long_inputs=settings.long_inputs,
        encodings=request.encoding_format,
    )
    units = [Unit(op=op, text=t, params=params) for t in _as_list(request.inputs)]
    paths = list_paths(request)
    if op is Op.ROWS:  # the pipeline's shape: [1, tokens, hidden] per input
        return Job(units, _rows_finish(_is_list(request)), paths)
    fmt = request.encoding_format
    is_list = _is_list(request)

    def finish(answers: list[Any]) -> Any:
        # A sparse answer as the spec's array of floats: the full vocabulary-wide vector
        # (`SparseEncoder.encode(..., convert_to_sparse_tensor=False)`); /embed_sparse sends
        # only the non-zero entries.
        vectors = [a.dense() for a in answers] if op is Op.SPARSE else answers
        out = encode_all(vectors, fmt)
        return out if is_list else [out[0]]

    headers = dimension_warning(info, params.dimensions)
    return Job(units, finish, paths, headers)


def _rows_finish(is_list: bool) -> Any:
    def finish(answers: list[Any]) -> Any:
        rows = [[a] for a in answers]
        return rows if is_list else rows[0]

    return finish


_ROOT_FIELDS = ("normalize", "prompt_name", "truncate", "dimensions", "truncation_direction")


def _merged(request: FeatureExtractionRequest) -> FeatureExtractionParams:
    """Root-level fields (the spec) and `parameters` (older clients): one set; where a field
    is given in both, the root's wins (as `FeatureExtractionParams` says: every value of
    either place is valid by the document, so neither may be refused for the other); the
    nested `truncation` where neither gives `truncate`."""
    nested = request.parameters or FeatureExtractionParams()
    if nested.truncate is None:
        nested = nested.model_copy(update={"truncate": nested.truncation})
    root = {
        name: value
        for name in _ROOT_FIELDS
        if (value := getattr(request, name)) is not None  # (validated: copied as they are)
    }
    return nested.model_copy(update=root)


def _similarity(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, SentenceSimilarityRequest)
    require(info, Op.EMBED, "sentence-similarity")
    params = request.parameters or SentenceSimilarityParams()
    unit_params = embedding_params(
        info,
        truncate=params.truncation,
        direction=None,
        prompt_name=params.prompt_name,
        long_inputs=settings.long_inputs,
    )
    texts_ = [request.inputs.source_sentence, *request.inputs.sentences]
    if len(texts_) > settings.max_client_batch_size:
        raise _too_many(len(texts_), settings.max_client_batch_size)
    units = [Unit(op=Op.EMBED, text=t, params=unit_params) for t in texts_]
    paths = ["inputs.source_sentence"] + [f"inputs.sentences[{i}]" for i in range(len(texts_) - 1)]
    return Job(units, cosine_to_first, paths)


def _too_many(n: int, limit: int) -> Exception:
    return PayloadTooLarge(f"{n} inputs in one request; at most {limit} (MAX_CLIENT_BATCH_SIZE)")


class FeatureExtractionAnswer(
    RootModel[list[list[float]] | list[float] | list[str] | list[list[int]]]
):
    """One vector per input (a single input: a list holding one), as `encoding_format` asks
    (floats, base64 strings, packed binary bytes); a sparse (SPLADE) model: the full
    vocabulary-wide vector; sentence-similarity: one cosine similarity per sentence."""


class TokenRowsAnswer(RootModel[list[list[list[float]]] | list[list[list[list[float]]]]]):
    """Per input `[1, tokens, hidden]` (a single input: that alone)."""
