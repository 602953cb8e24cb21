"""The Inference API's text-classification and zero-shot-classification tasks on `POST /`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, ConfigDict, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.params import PairParams
from service.engine.types import ModelInfo
from service.errors import InvalidInput, PayloadTooLarge
from service.protocols.hf_shapes import _as_list, _is_list, _Request, list_paths
from service.protocols.params import (
    TextClassificationParams,
    ZeroShotParams,
)
from service.protocols.schemas import (
    NonBlank,
    Texts,
    inputs_list,
    texts,
)
from service.settings import Settings


class TextPair(BaseModel):
    """A text pair for a classifier (what the text-classification pipeline takes)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    text: NonBlank
    text_pair: NonBlank | None = None


class TextClassificationRequest(_Request):
    inputs: Annotated[
        NonBlank | TextPair | Annotated[list[NonBlank | TextPair], inputs_list()],
        BeforeValidator(texts("inputs", pairs=True)),
    ]
    parameters: TextClassificationParams | None = None


class ZeroShotRequest(_Request):
    inputs: Texts
    parameters: ZeroShotParams


# -- text-classification and zero-shot ---------------------------------------------------------
def _text_classification(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, TextClassificationRequest)
    params = request.parameters or TextClassificationParams()
    unit_params = PairParams(
        truncate=settings.truncate if params.truncation is None else params.truncation,
        top_k=params.top_k,
        function_to_apply=params.function_to_apply,
    )
    units = []
    for item in _as_list(request.inputs):
        text, pair = (item, None) if isinstance(item, str) else (item.text, item.text_pair)
        units.append(Unit(op=Op.CLASSIFY, text=text, pair=pair, params=unit_params))
    # One list of labels per input; a single input too (the client reads response[0]).
    return Job(units, paths=list_paths(request))


def _zero_shot(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, ZeroShotRequest)
    params = request.parameters
    labels = _labels(params.candidate_labels)
    sequences = _as_list(request.inputs)
    max_inputs = settings.max_client_batch_size
    if len(sequences) * len(labels) > max_inputs:
        raise PayloadTooLarge(
            f"{len(sequences)} input(s) x {len(labels)} candidate labels is "
            f"{len(sequences) * len(labels)} premise/hypothesis pairs; at most {max_inputs} "
            "per request (MAX_CLIENT_BATCH_SIZE)"
        )
    template = params.hypothesis_template
    hypotheses = [hypothesis(template, label) for label in labels]
    unit_params = PairParams(
        truncate=settings.truncate if params.truncation is None else params.truncation,
        strategy="only_first",  # the pipeline's: never cut the hypothesis
    )
    units = [
        Unit(op=Op.LOGITS, text=seq, pair=hyp, params=unit_params)
        for seq in sequences
        for hyp in hypotheses
    ]

    def finish(logits: list[npt.ArrayLike]) -> object:
        n = len(labels)
        answers = [
            zero_shot_scores(logits[i * n : (i + 1) * n], labels, params.multi_label, info)
            for i in range(len(sequences))
        ]
        return answers if _is_list(request) else answers[0]

    return Job(units, finish, list_paths(request, per_input=len(labels)))


def hypothesis(template: str, label: str) -> str:
    """The hypothesis for `label`: the template's `{}` (or `{0}`) replaced by it, which is what
    the pipeline's `template.format(label)` gives for such templates. Every other brace is
    refused (422): `str.format` would run format specs (`{:>99999999}` built a 100 MB string
    per label on the event loop) and attribute lookups (`{0.__class__}`)."""
    text = template.replace("{0}", "{}")
    if text.count("{}") == 0 or "{" in text.replace("{}", "") or "}" in text.replace("{}", ""):
        raise InvalidInput(
            "parameters.hypothesis_template must hold {} where the label goes and no other "
            f"braces (e.g. 'This example is {{}}.'), not {template[:100]!r}"
        )
    return text.replace("{}", label)


def _labels(raw: list[str] | str) -> list[str]:
    """Candidate labels; one string is split on commas (the pipeline's `_parse_labels`)."""
    labels = [x.strip() for x in raw.split(",") if x.strip()] if isinstance(raw, str) else raw
    if not labels:
        raise InvalidInput("parameters.candidate_labels is empty; send at least one label")
    for i, label in enumerate(labels):
        if not label.strip():
            raise InvalidInput(f"parameters.candidate_labels[{i}] is empty")
    return labels


def zero_shot_scores(
    logits: Sequence[npt.ArrayLike], labels: list[str], multi_label: bool, info: ModelInfo
) -> list[dict[str, object]]:
    """The zero-shot pipeline's postprocess for one sequence: from each label's NLI logits,
    entailment against contradiction per label (multi_label, or one label), else a softmax of
    the entailment logits over the labels; highest first, in the spec's `{label, score}`."""
    rows = np.stack(logits)  # [labels, NLI classes]
    entail = info.entailment_id
    if multi_label or len(labels) == 1:
        contradiction = -1 if entail == 0 else 0
        pair = np.exp(rows[:, [contradiction, entail]])
        scores = (pair / pair.sum(-1, keepdims=True))[:, 1]
    else:
        exp = np.exp(rows[:, entail])
        scores = exp / exp.sum(-1, keepdims=True)
    order = list(reversed(scores.argsort()))
    return [{"label": labels[i], "score": float(scores[i])} for i in order]


# -- answers (their JSON schemas go into /openapi.json; the routes build plain JSON) ---------
class Label(BaseModel):
    label: str
    score: float


class TextClassificationAnswer(RootModel[list[list[Label]]]):
    """One list of labels per input, highest first (a single input: a list holding one)."""


class ZeroShotAnswer(RootModel[list[Label] | list[list[Label]]]):
    """The candidate labels, highest first (a list of inputs: one such list each)."""
