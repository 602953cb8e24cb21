"""What the routes of a multi-vector model share: its unit params, and a query and its
documents as units with their late-interaction scores (`/rerank` on such a model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from service.engine.jobs import Op, Unit
from service.engine.multi_vector.scoring import late_interaction
from service.engine.params import MultiVectorParams
from service.engine.types import ModelInfo
from service.settings import Settings


def multi_vector_params(
    input_type: Literal["query", "document"], truncate: bool | None, s: Settings
) -> MultiVectorParams:
    """A `multi_vector` unit's options (`service.engine.multi_vector.engine`): the input type,
    and what an input over its length gets (the request's `truncate`, else LONG_INPUTS)."""
    return MultiVectorParams(
        input_type=input_type,
        truncate=s.long_inputs == "truncate" if truncate is None else truncate,
        chunk=truncate is None and s.long_inputs == "chunk",
    )


def query_and_documents(
    query: str, documents: Sequence[str], truncate: bool | None, s: Settings
) -> list[Unit]:
    """The query's unit (encoded as a query) first, then one per document."""
    as_query = multi_vector_params("query", truncate, s)
    as_document = multi_vector_params("document", truncate, s)
    return [
        Unit(op=Op.MULTI_VECTOR, text=query, params=as_query),
        *(Unit(op=Op.MULTI_VECTOR, text=d, params=as_document) for d in documents),
    ]


def scores(answers: Sequence[Any], info: ModelInfo) -> list[float]:
    """Each document's score against the query (`answers`: the query's token vectors, then
    each document's), by the model's own similarity (MaxSim, or MeanMaxSim)."""
    similarity = (info.multi_vector or {}).get("scoring", "maxsim")
    return late_interaction(answers[0], answers[1:], similarity)
