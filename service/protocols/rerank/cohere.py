"""Cohere's rerank API, v2: `POST /v2/rerank`, as the `cohere` SDK (`ClientV2.rerank`) sends and
reads it (`service.protocols.cohere_shapes` says where the shapes come from).

Request: `query` (non-blank), `documents` (1 to MAX_CLIENT_BATCH_SIZE non-blank strings),
`model` (accepted, any name), `top_n` (at least 1: the n best; default all),
`max_tokens_per_doc` (each document cut to its first N tokens before it is paired with the
query; Cohere's default, 4096, is past any encoder's limit), `priority` (accepted and
ignored). Every pair is then truncated longest-first at the model's limit, as
`CrossEncoder.predict` does. Answer (`V2RerankResponse`): `id`, `results` (`index` into
`documents`, `relevance_score`: `CrossEncoder.predict`'s score), highest first, and `meta`
(`billed_units.input_tokens`: the tokens every pair took). Scores, order and the cut are
`service.protocols.rerank.common`'s. On a multi-vector model, the query and each document
are encoded on their own (truncated at their lengths; `max_tokens_per_doc` cuts the
document's text first) and `relevance_score` is the document's late-interaction score
(MaxSim or MeanMaxSim, as `/rerank` gives it); `input_tokens` counts the query once.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field

from service.engine.jobs import Counted, Job
from service.engine.types import ModelInfo, Output
from service.errors import Envelope
from service.protocols import cohere_shapes
from service.protocols.multi_vector import common as multi_vector
from service.protocols.rerank.common import documents_job, ranked, relevance, reranker, tokens
from service.protocols.schemas import INTEGRAL, MAX_TOKENS, NonBlank, decode, inputs_list, validate
from service.protocols.schemas import texts as text_inputs
from service.protocols.serving import Endpoint
from service.settings import Settings


class CohereRerankRequest(cohere_shapes._Request):
    query: Annotated[NonBlank, BeforeValidator(text_inputs("query"))]
    documents: Annotated[list[NonBlank], inputs_list(), BeforeValidator(text_inputs("documents"))]
    model: str | None = Field(None, description="accepted; the server has one model")
    top_n: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    max_tokens_per_doc: Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None = None
    priority: Annotated[int, Field(ge=0), INTEGRAL] | None = Field(
        None, description="accepted and ignored"
    )


class CohereRerankResult(BaseModel):
    index: int = Field(ge=0)
    relevance_score: float


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereRerankResult]
    meta: cohere_shapes.Meta


def _rerank(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    doc = decode(body, content_type, raw_text=False)
    r = validate(CohereRerankRequest, doc, what="/v2/rerank", max_inputs=s.max_client_batch_size)

    def answer(scores: list[float], used: int) -> dict[str, object]:
        return {
            "id": cohere_shapes.answer_id(),
            "results": [
                {"index": i, "relevance_score": scores[i]} for i in ranked(scores, r.top_n)
            ],
            "meta": cohere_shapes.meta(used),
        }

    if info.output is Output.MULTI_VECTOR:
        return multi_vector.rerank_job(
            r.query, r.documents, info, s, answer, max_tokens_per_doc=r.max_tokens_per_doc
        )

    def finish(answers: list[Counted]) -> dict[str, object]:
        return answer(relevance(answers, info), tokens(answers))

    return documents_job(r.query, r.documents, finish, pair_max_tokens=r.max_tokens_per_doc)


ENDPOINTS = (
    Endpoint(
        path="/v2/rerank",
        summary="Rerank documents against a query with a cross-encoder, or a multi-vector "
        "model's MaxSim (Cohere v2)",
        parse=_rerank,
        check=reranker("/v2/rerank"),
        request=CohereRerankRequest,
        response=CohereRerankResponse,
        envelope=Envelope.COHERE,
    ),
)
