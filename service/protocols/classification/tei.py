"""text-embeddings-inference's `/predict`: every label's score per input, and TEI's score rule
shared with `/rerank`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.protocols.schemas import (
    NonBlank,
    inputs_list,
)
from service.protocols.serving import Endpoint, needs
from service.protocols.tei_shapes import (
    Direction,
    PredictSequence,
    _pair_params,
    _parsed,
    _predict_inputs,
    _Request,
    scores,
)
from service.settings import Settings


class PredictRequest(_Request):
    inputs: Annotated[
        NonBlank | PredictSequence | Annotated[list[PredictSequence], inputs_list()],
        BeforeValidator(_predict_inputs),
    ]
    raw_scores: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None


class Prediction(BaseModel):
    score: float
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """A single input: its labels, highest first; a batch: one such list per input."""


def _predict(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: PredictRequest = _parsed(PredictRequest, body, content_type, "/predict", s)
    batch = isinstance(r.inputs, list) and isinstance(r.inputs[0], list)
    sequences: list[Any] = list(r.inputs) if batch else [r.inputs]
    params = _pair_params(r.truncate, r.truncation_direction, s)
    jobs = []
    for seq in sequences:
        if isinstance(seq, str):
            jobs.append(Unit(op=Op.LOGITS, text=seq, params=params))
        else:
            pair = seq[1] if len(seq) == 2 else None
            jobs.append(Unit(op=Op.LOGITS, text=seq[0], pair=pair, params=params))
    raw = bool(r.raw_scores)

    def finish(logits: list[npt.ArrayLike]) -> object:
        answers = [predictions(x, info.labels, raw) for x in logits]
        return answers if batch else answers[0]

    return Job(jobs, finish)


def predictions(logits: npt.ArrayLike, labels: Sequence[str], raw: bool) -> list[dict[str, object]]:
    """Every label's score, highest first (ties: in label order)."""
    values = scores(logits, raw)
    order = sorted(range(values.size), key=lambda i: (-values[i], i))
    return [{"score": values[i], "label": labels[i]} for i in order]


ENDPOINTS = (
    Endpoint(
        path="/predict",
        summary="Sequence classification scores (TEI)",
        parse=_predict,
        check=needs(Op.LOGITS, "/predict"),
        request=PredictRequest,
        response=PredictResponse,
    ),
)
