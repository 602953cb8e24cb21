"""Cohere's embed API, v2: `POST /v2/embed`, as the `cohere` SDK (`ClientV2.embed`) sends and
reads it (`service.protocols.cohere_shapes` says where the shapes come from).

Request: `texts` (1 to MAX_CLIENT_BATCH_SIZE non-blank strings); `model` (accepted, any
name: the server has one model); `input_type` (`search_query`, `search_document`,
`classification`, `clustering`: the folder's prompts, `service.protocols.embedding.common`;
`image` is refused, this server embeds text); `embedding_types` (`float`, `int8`, `uint8`,
`binary`, `ubinary`, `base64`; default `float`); `output_dimension` (the first N dimensions,
normalized again where the model normalizes: `encode(truncate_dim=N)` then normalization;
at most the width the model emits); `max_tokens` (a lower limit per text, in its own tokens with
the prompt, special tokens not counted); `truncate`
(`END`, Cohere's default: cut the end at the limit; `START`: cut the start; `NONE`: 422 past
the limit); `priority` (accepted and ignored: admission is first come, first served).
`images` and `inputs` are unknown fields here (422).

Answer (`EmbedByTypeResponse`): `id` (a new UUID), `embeddings` with one list per asked type
(in the order of `texts`), `texts`, `meta` (`api_version`, `billed_units.input_tokens`: the
tokens the texts took, prompt and special tokens included, after truncation) and
`response_type: "embeddings_by_type"`. Vectors are the model's own (`SentenceTransformer.encode`
with the prompt, its normalization); the encodings are `service.protocols.encodings`' (int8
and uint8 on calibrated ranges). A cut to a width the model was not trained for adds the
`Warning` header, as `dimensions` does on the other routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from service.engine.jobs import Counted, Job, Op, Unit
from service.engine.params import Side
from service.engine.types import ModelInfo
from service.errors import Envelope
from service.protocols import cohere_shapes
from service.protocols.embedding.common import dimension_warning, embedding_params
from service.protocols.encodings import encode_all
from service.protocols.schemas import (
    INTEGRAL,
    MAX_TOKENS,
    Dimensions,
    NonBlank,
    decode,
    inputs_list,
    validate,
)
from service.protocols.schemas import texts as text_inputs
from service.protocols.serving import Endpoint, needs
from service.settings import Settings

InputType = Literal["search_query", "search_document", "classification", "clustering"]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
#: `truncate` -> (truncate, direction)
_TRUNCATE: dict[str, tuple[bool, Side]] = {
    "END": (True, "right"),
    "START": (True, "left"),
    "NONE": (False, "right"),
}


class CohereEmbedRequest(cohere_shapes._Request):
    texts: Annotated[list[NonBlank], inputs_list(), BeforeValidator(text_inputs("texts"))]
    model: str | None = Field(None, description="accepted; the server has one model")
    input_type: InputType | None = Field(
        None, description="the folder's prompt: query, document, or one of that name"
    )
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] | None = None
    output_dimension: Dimensions | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None
    priority: Annotated[int, Field(ge=0), INTEGRAL] | None = Field(
        None, description="accepted and ignored"
    )


Int8 = Annotated[int, Field(ge=-128, le=127)]
UInt8 = Annotated[int, Field(ge=0, le=255)]


class CohereEmbeddings(BaseModel):
    """One list per asked type, each in the order of `texts`."""

    float_: list[list[float]] | None = Field(None, alias="float")
    int8: list[list[Int8]] | None = None
    uint8: list[list[UInt8]] | None = None
    binary: list[list[Int8]] | None = None
    ubinary: list[list[UInt8]] | None = None
    base64: list[str] | None = None


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: cohere_shapes.Meta
    response_type: Literal["embeddings_by_type"]


def _embed(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    doc = decode(body, content_type, raw_text=False)
    r = validate(CohereEmbedRequest, doc, what="/v2/embed", max_inputs=s.max_client_batch_size)
    types = list(dict.fromkeys(r.embedding_types or ["float"]))  # each once, in order
    truncate, direction = _TRUNCATE[r.truncate or "END"]
    params = embedding_params(
        info,
        truncate=truncate,
        direction=direction,
        prompt_name=r.input_type,
        dimensions=r.output_dimension,
        encodings=types,
        dimensions_field="output_dimension",
        count_tokens=True,
        max_tokens=r.max_tokens,
    )
    texts = list(r.texts)

    def finish(answers: list[Counted]) -> dict[str, Any]:
        vectors = [a.answer for a in answers]
        return {
            "id": cohere_shapes.answer_id(),
            "embeddings": {t: encode_all(vectors, t) for t in types},
            "texts": texts,
            "meta": cohere_shapes.meta(sum(a.tokens for a in answers)),
            "response_type": "embeddings_by_type",
        }

    units = [Unit(op=Op.EMBED, text=t, params=params) for t in texts]
    paths = [f"texts[{i}]" for i in range(len(texts))]
    headers = dimension_warning(info, r.output_dimension, "output_dimension")
    return Job(units, finish, paths, headers)


ENDPOINTS = (
    Endpoint(
        path="/v2/embed",
        summary="Embeddings by type (Cohere v2)",
        parse=_embed,
        check=needs(Op.EMBED, "/v2/embed"),
        request=CohereEmbedRequest,
        response=CohereEmbedResponse,
        envelope=Envelope.COHERE,
    ),
)
