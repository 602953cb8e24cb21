"""The Hugging Face Inference API on `POST /`: the task specs' request and answer shapes, as
`huggingface_hub`'s InferenceClient sends and reads them (`shared/specs/hf-tasks`).

Where the spec and the client disagree, the client wins (docs/api.md, "Where a spec and the
client disagree"):
- text-classification answers one list of `{label, score}` per input (a single string: a list
  holding one list), every label highest first unless `top_k` is given: the client reads
  `response[0]` as the list of labels;
- feature-extraction fields sit at the body's root (the spec's and the client's), and are also
  accepted under `parameters` (older clients);
- zero-shot-classification answers the spec's `[{label, score}]`, highest first.
Raw text (the seed's `curl -d`) answers what JSON with that one string answers. The hosted
API's `options` (`wait_for_model`, `use_cache`) are accepted and ignored.

This module dispatches `POST /` to the loaded task's codec (`service.protocols.<task>.hf`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, RootModel

from service.engine.jobs import Job, Op
from service.engine.types import ModelInfo, Output
from service.errors import InvalidInput
from service.protocols.classification.hf import (
    TextClassificationAnswer,
    TextClassificationRequest,
    ZeroShotAnswer,
    ZeroShotRequest,
    _text_classification,
    _zero_shot,
)
from service.protocols.embedding.hf import (
    FeatureExtractionAnswer,
    FeatureExtractionRequest,
    SentenceSimilarityRequest,
    TokenRowsAnswer,
    _feature_extraction,
    _similarity,
)
from service.protocols.hf_shapes import _Request
from service.protocols.schemas import (
    RawText,
    decode,
    invalid,
    validate,
)
from service.protocols.serving import require
from service.protocols.tokens.hf import (
    FillMaskAnswer,
    FillMaskRequest,
    TokenClassificationAnswer,
    TokenClassificationRequest,
    _pipeline_task,
)
from service.settings import Settings

#: The JSON request model of `POST /` per task (sentence-similarity: embedding models too).
REQUESTS: dict[str, type[_Request]] = {
    "feature-extraction": FeatureExtractionRequest,
    "sentence-similarity": SentenceSimilarityRequest,
    "text-classification": TextClassificationRequest,
    "zero-shot-classification": ZeroShotRequest,
    "fill-mask": FillMaskRequest,
    "token-classification": TokenClassificationRequest,
}


def parse(body: bytes, content_type: str | None, info: ModelInfo, settings: Settings) -> Job:
    """`POST /`: raw text or the task's JSON request -> the job (see the module docstring)."""
    if info.output is Output.MULTI_VECTOR:  # token vectors have no Inference API task
        require(info, Op.EMBED, "POST /")
    doc = decode(body, content_type, raw_text=True)
    task = info.task
    if isinstance(doc, RawText):
        doc = {"inputs": str(doc)}
    elif task == "feature-extraction" and _similarity_shaped(doc):
        task = "sentence-similarity"
    if task == "zero-shot-classification" and isinstance(doc, dict) and not doc.get("parameters"):
        raise InvalidInput(
            "parameters.candidate_labels is missing: zero-shot-classification needs the labels "
            'to choose from, e.g. {"inputs": "...", "parameters": {"candidate_labels": '
            '["sports", "politics"]}}'
        )
    request = validate(REQUESTS[task], doc, what=task, max_inputs=settings.max_client_batch_size)
    return _BUILDERS[task](request, info, settings)


def _similarity_shaped(doc: Any) -> bool:
    """`inputs` as `{source_sentence, sentences}`: the sentence-similarity task's request."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    return isinstance(inputs, dict) and bool({"source_sentence", "sentences"} & inputs.keys())


def answer_model(info: ModelInfo) -> type[RootModel[Any]]:
    """The answer of `POST /` for the loaded model."""
    if info.task == "feature-extraction":
        dense = info.output is not Output.TOKEN_ROWS
        return FeatureExtractionAnswer if dense else TokenRowsAnswer
    answers: dict[str, type[RootModel[Any]]] = {
        "text-classification": TextClassificationAnswer,
        "zero-shot-classification": ZeroShotAnswer,
        "fill-mask": FillMaskAnswer,
    }
    return answers.get(info.task, TokenClassificationAnswer)


def request_models(info: ModelInfo) -> list[type[BaseModel]]:
    """The JSON request models `POST /` accepts for the loaded model."""
    if info.task == "feature-extraction" and Op.EMBED in info.ops:
        return [FeatureExtractionRequest, SentenceSimilarityRequest]
    return [REQUESTS[info.task]]


_BUILDERS = {
    "feature-extraction": _feature_extraction,
    "sentence-similarity": _similarity,
    "text-classification": _text_classification,
    "zero-shot-classification": _zero_shot,
    "fill-mask": _pipeline_task,
    "token-classification": _pipeline_task,
}


__all__ = [
    "REQUESTS",
    "answer_model",
    "invalid",
    "parse",
    "request_models",
]
