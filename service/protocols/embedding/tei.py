"""text-embeddings-inference's embedding routes: `/embed`, `/embed_sparse`, `/embed_all`,
`/similarity`.

TEI's shapes and semantics as `service.protocols.tei_shapes` describes them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.errors import InvalidInput, PayloadTooLarge
from service.protocols.embedding.common import (
    LATE_CHUNKING,
    SimilarityInputs,
    cosine_to_first,
    dimension_warning,
    embedding_params,
    late_chunking_schema,
    late_unit,
)
from service.protocols.encodings import EncodingField, encode_all
from service.protocols.schemas import (
    INTEGRAL,
    Dimensions,
    LateChunking,
    PromptName,
)
from service.protocols.serving import Endpoint, needs
from service.protocols.tei_shapes import Direction, Input, _direction, _parsed, _Request, units
from service.settings import Settings


class EmbedRequest(_Request):
    model_config = ConfigDict(json_schema_extra=late_chunking_schema("inputs"))

    inputs: Input
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None
    dimensions: Dimensions | None = None
    encoding_format: EncodingField | None = Field(
        None, description="ours: float (default), base64, int8, uint8, binary or ubinary"
    )
    late_chunking: LateChunking | None = LATE_CHUNKING


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


class SimilarityParameters(_Request):
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None


class SimilarityRequest(_Request):
    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None


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


class SimilarityResponse(RootModel[list[float]]):
    """Cosine similarity of each sentence to the source sentence, in order."""


def _embed(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedRequest = _parsed(EmbedRequest, body, content_type, "/embed", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        normalize=r.normalize,
        dimensions=r.dimensions,
        long_inputs=s.long_inputs,
        encodings=r.encoding_format,
    )
    fmt = r.encoding_format
    headers = dimension_warning(info, r.dimensions)
    if r.late_chunking:
        if r.truncate:
            raise InvalidInput(
                "truncate does not combine with late_chunking: a long document is encoded in "
                "overlapping windows instead (/info's limits.late_chunking)"
            )
        unit = late_unit(r.inputs, params, "inputs", info)
        finish = lambda a: encode_all(list(a[0]), fmt)  # noqa: E731
        return Job([unit], finish, paths=("inputs",), headers=headers)
    return Job(units(Op.EMBED, r.inputs, params), lambda a: encode_all(a, fmt), headers=headers)


def _embed_sparse(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedSparseRequest = _parsed(EmbedSparseRequest, body, content_type, "/embed_sparse", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        long_inputs=s.long_inputs,
        max_active_dims=r.max_active_dims,
    )
    return Job(units(Op.SPARSE, r.inputs, params), lambda a: [v.pairs() for v in a])


def _embed_all(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedAllRequest = _parsed(EmbedAllRequest, body, content_type, "/embed_all", s)
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        long_inputs=s.long_inputs,
    )
    return Job(units(Op.ROWS, r.inputs, params))


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
        long_inputs=s.long_inputs,
    )
    return Job([Unit(op=Op.EMBED, text=t, params=params) for t in texts], cosine_to_first)


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
        path="/similarity",
        summary="Cosine similarity of sentences to a source sentence (TEI)",
        parse=_similarity,
        check=needs(Op.EMBED, "/similarity"),
        request=SimilarityRequest,
        response=SimilarityResponse,
    ),
)
