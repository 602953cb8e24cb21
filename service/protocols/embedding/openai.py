"""OpenAI's embeddings API: `POST /v1/embeddings` and `GET /v1/models`, as the openai SDK sends and
reads them.

`input` is a string, a list of strings, a list of token ids (one input) or a list of those. The
OpenAI API defines token ids as OpenAI's tiktoken ids, which are not this model's tokens
(LangChain's `OpenAIEmbeddings` sends them unless `check_embedding_ctx_length=False`): they are
refused with 422 saying so, unless `OPENAI_TOKEN_IDS=model`, which reads them as this model's
own ids (vLLM's reading), used as given (no special tokens added; ids outside the vocabulary
422). Vectors are the model's sentence embeddings, always L2-normalized, whether or not the
model ends in a Normalize module (OpenAI's vectors are unit length, and clients take dot
products as cosines); `dimensions` keeps the first N, then normalizes again (as OpenAI's text-
embedding-3 models answer), with a `Warning` header when the model was not trained for
Matryoshka cuts. `encoding_format: "base64"` (what the SDK asks for when the caller names no
format, and decodes itself) is each vector's little-endian float32 bytes in base64;
`int8`/`uint8` (calibrated ranges) and `binary`/`ubinary` are sentence-transformers'
`quantize_embeddings` codes
(`service.protocols.encodings`). `model` is accepted and the answer names our served model
(`info.served_name`); `user` is accepted and ignored. `usage` counts the tokens each input took
with this model's tokenizer (after truncation), counted in the inference thread. Errors on
`/v1/*` use OpenAI's envelope (`service.errors.Envelope.OPENAI`).

Jina's embeddings API is the same route with more fields, which its clients (Chroma's
`JinaEmbeddingFunction`, LangChain's Jina embeddings, langchain4j's `JinaEmbeddingModel`) send:
`late_chunking`, `task` (a prompt: `embedding.common.task_prompt`), `embedding_type` (the
`encoding_format` of the same name), `normalized` (false: the vectors as pooled) and
`truncate` (true cuts, false refuses; unset: LONG_INPUTS).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.engine.jobs import Counted, Job, Op
from service.engine.params import EmbedParams
from service.engine.types import ModelInfo
from service.errors import Envelope, InvalidInput
from service.protocols import tei_shapes
from service.protocols.embedding.common import (
    LATE_CHUNKING,
    dimension_warning,
    embedding_params,
    late_chunking_schema,
    late_unit,
    task_prompt,
)
from service.protocols.encodings import EncodingField, encode_vector
from service.protocols.schemas import (
    Dimensions,
    JinaTask,
    LateChunking,
    NonBlank,
    decode,
    inputs_list,
    validate,
)
from service.protocols.serving import (
    Endpoint,
    needs,
)
from service.settings import Settings

#: TEI's `Input`, its messages naming `input`.
Input = Annotated[
    tei_shapes.InputType | Annotated[list[tei_shapes.InputType], inputs_list()],
    BeforeValidator(tei_shapes.embed_inputs("input")),
]


#: Jina's `embedding_type` values: the `encoding_format` values of the same meaning.
JinaEncoding = Literal["float", "base64", "binary", "ubinary"]


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        json_schema_extra=late_chunking_schema("input"),
    )

    input: Input
    model: str | None = Field(None, description="accepted; the answer names the served model")
    encoding_format: EncodingField | None = None
    dimensions: Dimensions | None = None
    user: str | None = Field(None, description="accepted and ignored")
    late_chunking: LateChunking | None = LATE_CHUNKING
    # Jina's embeddings API's fields (its clients send them to this route)
    task: JinaTask | None = Field(
        None,
        description="Jina's task: the model's prompt of that name, else the prompt the task "
        "means (retrieval.query and code.query: query; retrieval.passage and code.passage: "
        "document; separation: clustering; classification: classification) where the model "
        "has it, else none; a name that is neither a task nor a prompt is refused",
    )
    embedding_type: JinaEncoding | None = Field(
        None, description="Jina's name for encoding_format (float, base64, binary, ubinary)"
    )
    normalized: bool | None = Field(
        None, description="Jina's: false answers the vectors as pooled, not L2-normalized"
    )
    truncate: bool | None = Field(
        None,
        description="Jina's: true cuts inputs over the model's limit, false refuses them; "
        "unset: LONG_INPUTS",
    )


#: `input` without token ids: what /openapi.json shows while OPENAI_TOKEN_IDS=refuse.
TextInput = Annotated[
    NonBlank | Annotated[list[NonBlank], inputs_list()],
    BeforeValidator(tei_shapes.embed_inputs("input")),
]


class TextEmbeddingsRequest(EmbeddingsRequest):
    """The request as documented while token ids are refused (parsing uses `EmbeddingsRequest`,
    so token ids get the refusal's own message)."""

    input: TextInput  # type: ignore[assignment]


def _documented(settings: Settings) -> type[EmbeddingsRequest]:
    return EmbeddingsRequest if settings.openai_token_ids == "model" else TextEmbeddingsRequest


class Embedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | str | list[int] = Field(
        description="floats, base64 of float32 LE bytes, int8/uint8 codes, or packed bits "
        "(binary, ubinary)"
    )
    index: int = Field(ge=0)


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


#: The 422 for token ids while OPENAI_TOKEN_IDS=refuse.
FOREIGN_TOKEN_IDS = (
    "input holds token ids, which /v1/embeddings reads as OpenAI's tiktoken ids (the OpenAI "
    "API's definition), not this model's tokens; send the text itself (LangChain's "
    "OpenAIEmbeddings: check_embedding_ctx_length=False), or start the server with "
    "OPENAI_TOKEN_IDS=model to read them as this model's own token ids"
)


def _holds_token_ids(value: Any) -> bool:
    """A validated `input` is token ids or a list holding some: a list of ints, or a list whose
    items include a list."""
    if not isinstance(value, list):
        return False
    return any(isinstance(x, list) or not isinstance(x, str) for x in value)


def _encoding(r: EmbeddingsRequest) -> Any:
    """The answer's encoding: `encoding_format`, else Jina's `embedding_type` (OpenAI's field
    wins where both are sent, as the root's value wins over `parameters` on `POST /`)."""
    return r.encoding_format if r.encoding_format is not None else r.embedding_type


def _params(r: EmbeddingsRequest, fmt: Any, info: ModelInfo, s: Settings) -> EmbedParams:
    """The units' options: unit length unless Jina's `normalized: false` (OpenAI's vectors are
    unit length, and clients take dot products as cosines); the model's default prompt, or
    the one Jina's `task` means; LONG_INPUTS unless Jina's `truncate` says."""
    if r.late_chunking and r.truncate:
        raise InvalidInput(
            "truncate does not combine with late_chunking: a long document is encoded in "
            "overlapping windows instead (/info's limits.late_chunking)"
        )
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=None,
        prompt_name=None,
        normalize=r.normalized is not False,
        dimensions=r.dimensions,
        long_inputs=s.long_inputs,
        encodings=fmt,
        count_tokens=True,
    )
    if r.task is None:
        return params
    return dataclasses.replace(params, prompt_name=task_prompt(info, r.task))


def _embeddings(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    doc = decode(body, content_type, raw_text=False)
    r = validate(EmbeddingsRequest, doc, what="/v1/embeddings", max_inputs=s.max_client_batch_size)
    if s.openai_token_ids == "refuse" and _holds_token_ids(r.input):
        raise InvalidInput(FOREIGN_TOKEN_IDS)
    fmt = _encoding(r)
    params = _params(r, fmt, info, s)

    def finish(answers: list[Counted]) -> dict[str, Any]:
        vectors = list(answers[0].answer) if late else [a.answer for a in answers]
        data = [
            {"object": "embedding", "embedding": encode_vector(v, fmt), "index": i}
            for i, v in enumerate(vectors)
        ]
        tokens = sum(a.tokens for a in answers)  # late: the joined text's, once
        return {
            "object": "list",
            "data": data,
            "model": info.served_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    headers = dimension_warning(info, r.dimensions)
    late = bool(r.late_chunking)
    if late:
        unit = late_unit(r.input, params, "input", info)
        return Job([unit], finish, paths=("input",), headers=headers)
    return Job(tei_shapes.units(Op.EMBED, r.input, params), finish, headers=headers)


ENDPOINTS = (
    Endpoint(
        path="/v1/embeddings",
        summary="Embeddings (OpenAI)",
        parse=_embeddings,
        check=needs(Op.EMBED, "/v1/embeddings"),
        request=EmbeddingsRequest,
        response=EmbeddingsResponse,
        envelope=Envelope.OPENAI,
        documented=_documented,
    ),
)
