"""The Jina-style rerank API that vLLM and Infinity serve too: `POST /v1/rerank`.

Request: `query` (non-blank), `documents` (1 to MAX_CLIENT_BATCH_SIZE non-blank strings),
`model` (accepted, any name), `top_n` (the n best; 0 or absent: all, as vLLM reads 0),
`return_documents` (default true: each result carries `document.text`). Every pair is
truncated longest-first at the model's limit, as `CrossEncoder.predict` does. Answer: `id`,
`model` (the served name), `usage.total_tokens` (the tokens every pair took) and `results`
(`index` into `documents`, `relevance_score`: `CrossEncoder.predict`'s score, `document`),
highest first (`service.protocols.rerank.common`). On a multi-vector model the query and each
document are encoded on their own (truncated at their lengths) and `relevance_score` is the
document's late-interaction score (MaxSim or MeanMaxSim, as `/rerank` gives it; vLLM serves
ColBERT models here too); `total_tokens` counts the query once. Errors come in OpenAI's
envelope, as on every `/v1/*` route (vLLM answers the same).
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.engine.jobs import Counted, Job
from service.engine.types import ModelInfo, Output
from service.errors import Envelope
from service.protocols.multi_vector import common as multi_vector
from service.protocols.rerank.common import documents_job, ranked, relevance, reranker, tokens
from service.protocols.schemas import INTEGRAL, NonBlank, decode, inputs_list, validate
from service.protocols.schemas import texts as text_inputs
from service.protocols.serving import Endpoint
from service.settings import Settings


class RerankDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    query: Annotated[NonBlank, BeforeValidator(text_inputs("query"))]
    documents: Annotated[list[NonBlank], inputs_list(), BeforeValidator(text_inputs("documents"))]
    model: str | None = Field(None, description="accepted; the answer names the served model")
    top_n: Annotated[int, Field(ge=0), INTEGRAL] | None = Field(
        None, description="the n best; 0 or absent: all"
    )
    return_documents: bool | None = Field(None, description="default true")


class RerankDocument(BaseModel):
    text: str


class RerankDocumentResult(BaseModel):
    index: int = Field(ge=0)
    relevance_score: float
    document: RerankDocument | None = Field(None, description="unless return_documents is false")


class RerankUsage(BaseModel):
    total_tokens: int = Field(ge=0)


class RerankDocumentsResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankDocumentResult]


def _rerank(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    doc = decode(body, content_type, raw_text=False)
    r = validate(RerankDocumentsRequest, doc, what="/v1/rerank", max_inputs=s.max_client_batch_size)
    with_text = r.return_documents is not False

    def answer(scores: list[float], used: int) -> dict[str, object]:
        results = []
        for i in ranked(scores, r.top_n):
            result: dict[str, object] = {"index": i, "relevance_score": scores[i]}
            if with_text:
                result["document"] = {"text": r.documents[i]}
            results.append(result)
        return {
            "id": f"rerank-{os.urandom(16).hex()}",
            "model": info.served_name,
            "usage": {"total_tokens": used},
            "results": results,
        }

    if info.output is Output.MULTI_VECTOR:
        return multi_vector.rerank_job(r.query, r.documents, info, s, answer)

    def finish(answers: list[Counted]) -> dict[str, object]:
        return answer(relevance(answers, info), tokens(answers))

    return documents_job(r.query, r.documents, finish)


ENDPOINTS = (
    Endpoint(
        path="/v1/rerank",
        summary="Rerank documents against a query with a cross-encoder, or a multi-vector "
        "model's MaxSim (Jina, vLLM)",
        parse=_rerank,
        check=reranker("/v1/rerank"),
        request=RerankDocumentsRequest,
        response=RerankDocumentsResponse,
        envelope=Envelope.OPENAI,  # vLLM's /v1/rerank answers OpenAI's
    ),
)
