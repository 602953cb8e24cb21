"""What the routes of a multi-vector model share: its unit params, and a query and its
documents as units with their late-interaction scores (`/rerank`, `/v2/rerank` and
`/v1/rerank` on such a model)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from service.engine.jobs import Counted, Job, Op, Unit
from service.engine.multi_vector.scoring import late_interaction
from service.engine.params import MultiVectorParams
from service.engine.types import ModelInfo
from service.settings import Settings


def multi_vector_params(
    input_type: Literal["query", "document"], truncate: bool | None, s: Settings, **options: Any
) -> MultiVectorParams:
    """A `multi_vector` unit's options (`service.engine.multi_vector.engine`): the input type,
    what an input over its length gets (the request's `truncate`, else LONG_INPUTS), and the
    `options` that are set (`pool_factor`, `protected_tokens`, `max_tokens_per_doc`,
    `count_tokens`)."""
    return MultiVectorParams(
        input_type=input_type,
        truncate=s.long_inputs == "truncate" if truncate is None else truncate,
        chunk=truncate is None and s.long_inputs == "chunk",
        **{k: v for k, v in options.items() if v is not None},
    )


def query_and_documents(
    query: str, documents: Sequence[str], truncate: bool | None, s: Settings, **options: Any
) -> list[Unit]:
    """The query's unit (encoded as a query) first, then one per document; `options` go to
    every unit (`count_tokens`), `max_tokens_per_doc` to the documents'."""
    cut = options.pop("max_tokens_per_doc", None)
    as_query = multi_vector_params("query", truncate, s, **options)
    as_document = multi_vector_params("document", truncate, s, max_tokens_per_doc=cut, **options)
    return [
        Unit(op=Op.MULTI_VECTOR, text=query, params=as_query),
        *(Unit(op=Op.MULTI_VECTOR, text=d, params=as_document) for d in documents),
    ]


def scores(answers: Sequence[Counted | np.ndarray], info: ModelInfo) -> list[float]:
    """Each document's score against the query (`answers`: the query's token vectors, then
    each document's, bare or `Counted`), by the model's own similarity (MaxSim, or
    MeanMaxSim)."""
    similarity = (info.multi_vector or {}).get("scoring", "maxsim")
    vectors = [a.answer if isinstance(a, Counted) else a for a in answers]
    return late_interaction(vectors[0], vectors[1:], similarity)


def rerank_job(
    query: str,
    documents: Sequence[str],
    info: ModelInfo,
    s: Settings,
    finish: Callable[[list[float], int], object],
    max_tokens_per_doc: int | None = None,
) -> Job:
    """The Cohere and Jina rerank routes on a multi-vector model: the query and documents
    encoded as such, truncated at their lengths (as those routes truncate every pair), each
    document's late-interaction score against the query; `finish(scores, tokens)` answers
    (tokens: the query's and every document's, special tokens included)."""
    units = query_and_documents(
        query, documents, True, s, count_tokens=True, max_tokens_per_doc=max_tokens_per_doc
    )
    paths = ["query", *(f"documents[{i}]" for i in range(len(documents)))]

    def answer(answers: list[Counted]) -> object:
        return finish(scores(answers, info), sum(a.tokens for a in answers))

    return Job(units, answer, paths)
