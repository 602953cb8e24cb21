"""What every rerank dialect shares: which models rerank, the units of a query and its
documents, the relevance score of each pair, and the order and `top_n` cut of the answer.

A reranker is a cross-encoder: a sequence classifier with one label (TEI's reranker), or a
multi-vector model, whose documents score their late interaction with the query
(`service.protocols.multi_vector.common.rerank_job`: no activation). A cross-encoder's
(query, document) pair is one `logits` unit, truncated longest-first at the model's limit, as
`CrossEncoder.predict` tokenizes it. The relevance score is the model's own activation of the
logit, as `CrossEncoder.predict` applies it (`ModelInfo.score_activation`: the config's
`sentence_transformers.activation_fn`, sigmoid by default); TEI's `/rerank` keeps TEI's own
rule (sigmoid, or the logit with `raw_scores`). Results are highest score first, ties in
document order; `top_n` keeps the first n.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.engine.jobs import Counted, Job, Op, Unit
from service.engine.params import PairParams
from service.engine.types import ModelInfo, Output
from service.errors import InferenceFailed, WrongTask
from service.protocols.serving import require

#: A relevance score: a Python float, or float32 as TEI's rule computes it.
Score = float | np.float32

#: `ModelInfo.score_activation` -> the function applied to the logit (float64 in, float32 out).
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "identity": lambda x: x,
    "tanh": np.tanh,
}


def reranker(route: str, *, own_activation: bool = True) -> Callable[[ModelInfo], None]:
    """An `Endpoint.check`: a cross-encoder (one label) or a multi-vector model (its
    late-interaction scores), else 424 naming what the model is; with `own_activation`, a
    cross-encoder whose activation is in `ACTIVATIONS`."""

    def check(info: ModelInfo) -> None:
        if info.output is Output.MULTI_VECTOR:
            return
        require(info, Op.LOGITS, route)
        if len(info.labels) != 1:
            raise WrongTask(
                f"{route} needs a cross-encoder (a text-classification model with one label); "
                f"this model has {len(info.labels)} labels ({', '.join(info.labels)}): "
                "use /predict for its scores"
            )
        if own_activation and info.score_activation not in ACTIVATIONS:
            raise WrongTask(
                f"{route} applies the cross-encoder's own activation, and this model's "
                f"({info.score_activation}) is not one of {sorted(ACTIVATIONS)}"
            )

    return check


def pair_units(
    query: str, documents: Sequence[str], pair_max_tokens: int | None = None
) -> list[Unit]:
    """One `logits` unit per (query, document) pair, truncated longest-first at the model's
    limit from the right, its tokens counted; each document cut to its first
    `pair_max_tokens` tokens first where given."""
    params = PairParams(truncate=True, count_tokens=True, pair_max_tokens=pair_max_tokens)
    return [Unit(op=Op.LOGITS, text=query, pair=d, params=params) for d in documents]


def documents_job(
    query: str,
    documents: Sequence[str],
    finish: Callable[[list[Counted]], object],
    pair_max_tokens: int | None = None,
) -> Job:
    """The job of ranking `documents` against `query`: `pair_units`, answered by `finish`,
    each unit's errors named `documents[i]`."""
    paths = [f"documents[{i}]" for i in range(len(documents))]
    return Job(pair_units(query, documents, pair_max_tokens), finish, paths)


def relevance(answers: Sequence[Counted], info: ModelInfo) -> list[float]:
    """Each pair's score: the model's activation of its logit (float32, as `CrossEncoder`
    answers). Raises 500 for NaN."""
    logits = np.array([float(np.asarray(a.answer).reshape(-1)[0]) for a in answers])
    if np.isnan(logits).any():
        raise InferenceFailed("the model's score for this input is not a number (NaN)")
    scores = ACTIVATIONS[info.score_activation](logits).astype(np.float32)
    return [float(s) for s in scores]


def ranked(scores: Sequence[Score], top_n: int | None) -> list[int]:
    """Document indices, highest score first (ties in document order), the first `top_n`
    (None or 0: all)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:top_n] if top_n else order


def tokens(answers: Sequence[Counted]) -> int:
    """The tokens every pair took (special tokens included, after truncation)."""
    return sum(a.tokens for a in answers)
