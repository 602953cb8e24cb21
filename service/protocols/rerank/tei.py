"""text-embeddings-inference's `/rerank`: a cross-encoder's score of each (query, text) pair,
highest first, scored by TEI's rule (sigmoid of the logit, or the logit with `raw_scores`); on a
multi-vector model, each text's late-interaction score against the query (MaxSim or MeanMaxSim,
the model's own similarity: no activation, `raw_scores` changes nothing), highest first, as
`MultiVectorEncoder.similarity` orders them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, Field, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo, Output
from service.protocols.multi_vector import common as multi_vector
from service.protocols.rerank.common import Score, ranked, reranker
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


_cross_encoder = reranker("/rerank", own_activation=False)


def _reranker(info: ModelInfo) -> None:
    """A cross-encoder (TEI's reranker: one label), or a multi-vector model."""
    if info.output is not Output.MULTI_VECTOR:
        _cross_encoder(info)


def _rerank(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: RerankRequest = _parsed(RerankRequest, body, content_type, "/rerank", s)
    raw, with_text = bool(r.raw_scores), bool(r.return_text)
    if info.output is Output.MULTI_VECTOR:
        units = multi_vector.query_and_documents(r.query, r.texts, r.truncate, s)
        paths = ["query", *(f"texts[{i}]" for i in range(len(r.texts)))]
        return Job(units, lambda a: _ranks(multi_vector.scores(a, info), r.texts, with_text), paths)
    params = _pair_params(r.truncate, r.truncation_direction, s)
    jobs = [Unit(op=Op.LOGITS, text=r.query, pair=t, params=params) for t in r.texts]

    def finish(logits: list[npt.ArrayLike]) -> object:
        return _ranks([scores(x, raw)[0] for x in logits], r.texts, with_text)

    return Job(jobs, finish)


def _ranks(values: Sequence[Score], texts: list[str], with_text: bool) -> list[dict[str, object]]:
    """Every text, highest score first (ties in text order)."""
    ranks = []
    for i in ranked(values, None):
        rank: dict[str, object] = {"index": i, "score": values[i]}
        if with_text:
            rank["text"] = texts[i]
        ranks.append(rank)
    return ranks


ENDPOINTS = (
    Endpoint(
        path="/rerank",
        summary="Rerank texts against a query: a cross-encoder, or a multi-vector model's "
        "MaxSim (TEI)",
        parse=_rerank,
        check=_reranker,
        request=RerankRequest,
        response=RerankResponse,
    ),
)
