"""text-embeddings-inference's `/rerank`: a cross-encoder's score of each (query, text) pair,
highest first, scored by TEI's rule (sigmoid of the logit, or the logit with `raw_scores`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.protocols.rerank.common import ranked, reranker
from service.protocols.schemas import (
    NonBlank,
    inputs_list,
)
from service.protocols.schemas import texts as text_inputs
from service.protocols.serving import Endpoint
from service.protocols.tei_shapes import (
    Direction,
    _checked_text,
    _pair_params,
    _parsed,
    _Request,
    scores,
)
from service.settings import Settings


class RerankRequest(_Request):
    query: Annotated[NonBlank, BeforeValidator(lambda v: _checked_text(v, "query"))]
    texts: Annotated[list[NonBlank], inputs_list(), BeforeValidator(text_inputs("texts"))]
    raw_scores: bool | None = None
    return_text: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None


class Rank(BaseModel):
    index: int = Field(ge=0)
    score: float
    text: str | None = Field(None, description="only with return_text")


class RerankResponse(RootModel[list[Rank]]):
    """Every text, highest score first; `index` is its position in `texts`."""


def _rerank(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: RerankRequest = _parsed(RerankRequest, body, content_type, "/rerank", s)
    params = _pair_params(r.truncate, r.truncation_direction, s)
    jobs = [Unit(op=Op.LOGITS, text=r.query, pair=t, params=params) for t in r.texts]
    raw, with_text = bool(r.raw_scores), bool(r.return_text)

    def finish(logits: list[Any]) -> Any:
        values = [scores(x, raw)[0] for x in logits]
        ranks = []
        for i in ranked(values, None):
            rank: dict[str, Any] = {"index": i, "score": values[i]}
            if with_text:
                rank["text"] = r.texts[i]
            ranks.append(rank)
        return ranks

    return Job(jobs, finish)


ENDPOINTS = (
    Endpoint(
        path="/rerank",
        summary="Rerank texts against a query with a cross-encoder (TEI)",
        parse=_rerank,
        check=reranker("/rerank", own_activation=False),
        request=RerankRequest,
        response=RerankResponse,
    ),
)
