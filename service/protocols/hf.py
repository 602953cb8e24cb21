"""The Hugging Face Inference API on `POST /`: the task specs' request and answer shapes, as
`huggingface_hub`'s InferenceClient sends and reads them (`shared/specs/hf-tasks`).

Where the spec and the client disagree, the client wins (README, "Using it"):
- text-classification answers one list of `{label, score}` per input (a single string: a list
  holding one list), every label highest first unless `top_k` is given: the client reads
  `response[0]` as the list of labels;
- feature-extraction fields sit at the body's root (the spec's and the client's), and are also
  accepted under `parameters` (older clients);
- zero-shot-classification answers the spec's `[{label, score}]`, highest first.
Raw text (the seed's `curl -d`) answers what JSON with that one string answers. The hosted
API's `options` (`wait_for_model`, `use_cache`) are accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.model import ModelInfo
from service.errors import InvalidInput, PayloadTooLarge
from service.protocols.encodings import Encoding, encode_all
from service.protocols.params import (
    FeatureExtractionParams,
    FillMaskParams,
    Params,
    SentenceSimilarityParams,
    TextClassificationParams,
    TokenClassificationParams,
    ZeroShotParams,
    pipeline_params,
)
from service.protocols.schemas import (
    Dimensions,
    NonBlank,
    Normalize,
    PromptName,
    RawText,
    check_list,
    decode,
    inputs_list,
    invalid,
    texts,
    validate,
)
from service.protocols.serving import require
from service.settings import Settings


class Options(BaseModel):
    """The hosted API's options: accepted, and ignored (the model is always loaded)."""

    model_config = ConfigDict(extra="allow")
    wait_for_model: bool | None = None
    use_cache: bool | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    options: Options | None = None


Texts = Annotated[
    NonBlank | Annotated[list[NonBlank], inputs_list()], BeforeValidator(texts("inputs"))
]


class FeatureExtractionRequest(_Request):
    inputs: Texts
    normalize: Normalize | None = None
    prompt_name: PromptName | None = None
    truncate: bool | None = None
    truncation_direction: Literal["left", "right"] | None = None
    dimensions: Dimensions | None = None
    encoding_format: Encoding | None = None
    parameters: FeatureExtractionParams | None = None


def _sentences(value: Any, info: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("sentences"), list):
        check_list(value["sentences"], "inputs.sentences", info, "string")
    return value


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    source_sentence: Annotated[NonBlank, BeforeValidator(texts("inputs.source_sentence"))]
    sentences: Annotated[
        list[NonBlank], inputs_list(reserved=1), BeforeValidator(texts("inputs.sentences"))
    ]


class SentenceSimilarityRequest(_Request):
    inputs: Annotated[SimilarityInputs, BeforeValidator(_sentences)]
    parameters: SentenceSimilarityParams | None = None


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


class FillMaskRequest(_Request):
    inputs: Texts
    parameters: FillMaskParams | None = None


class TokenClassificationRequest(_Request):
    inputs: Texts
    parameters: TokenClassificationParams | None = None


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


def _is_list(request: _Request) -> bool:
    return isinstance(getattr(request, "inputs", None), list)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def list_paths(request: _Request, name: str = "inputs", per_input: int = 1) -> list[str] | None:
    """`inputs[i]` for each unit of a list request (`per_input` units each); None otherwise."""
    value = getattr(request, name)
    if not isinstance(value, list):
        return None
    return [f"{name}[{i}]" for i in range(len(value)) for _ in range(per_input)]


# -- feature-extraction and sentence-similarity ----------------------------------------------
def embedding_params(
    info: ModelInfo,
    *,
    truncate: bool | None,
    direction: str | None,
    prompt_name: str | None,
    normalize: bool | None = None,
    dimensions: int | None = None,
    default_truncate: bool = False,
) -> dict[str, Any]:
    """Unit params for `embed`/`rows`, checked against the model: a prompt it names, a
    `dimensions` it can cut to. Shared by every embedding protocol."""
    if prompt_name is not None and prompt_name not in info.prompts:
        known = ", ".join(sorted(info.prompts)) or "none"
        raise InvalidInput(
            f"prompt_name {prompt_name!r} is not one of this model's prompts: {known}"
        )
    if dimensions is not None and info.dimension is not None and dimensions > info.dimension:
        raise InvalidInput(
            f"dimensions {dimensions} is more than this model's {info.dimension}; send at most that"
        )
    return {
        "truncate": default_truncate if truncate is None else truncate,
        "direction": direction or "right",
        "prompt_name": info.default_prompt_name if prompt_name is None else prompt_name,
        # Unset: as the model's own pipeline does (its Normalize module), which is what
        # SentenceTransformer.encode answers; True for POOLING on plain models (TEI's default).
        "normalize": info.normalize if normalize is None else normalize,
        "dimensions": dimensions,
    }


def dimension_warning(info: ModelInfo, dimensions: int | None) -> dict[str, str] | None:
    """A `Warning` header (RFC 7234's 299, "miscellaneous persistent warning") when
    `dimensions` cuts a model that was not trained for Matryoshka cuts to that width: the
    answer is what was asked, but its quality is unknown. None otherwise."""
    full, trained = info.dimension, info.matryoshka_dimensions
    if dimensions is None or full is None or dimensions >= full:
        return None
    if trained is not None and (not trained or dimensions in trained):
        return None
    widths = "any width" if trained is None else f"only {list(trained)}"
    return {
        "Warning": f'299 pipeline-server "dimensions {dimensions} cuts a {full}-dimensional '
        f"model not trained for it (Matryoshka: {'none' if trained is None else widths}); "
        'similarities of cut vectors may be poor"'
    }


def _feature_extraction(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, FeatureExtractionRequest)
    fields = _merged(request)
    op = Op.SPARSE if info.sparse else Op.EMBED if Op.EMBED in info.ops else Op.ROWS
    if op is Op.ROWS and (
        fields.get("normalize") is not None
        or fields.get("dimensions")
        or request.encoding_format not in (None, "float")
    ):
        raise InvalidInput(
            "this model answers token rows (it has no sentence-transformers pooling config): "
            "normalize, dimensions and encoding_format need pooled embeddings; set POOLING to "
            "pool its rows"
        )
    if op is Op.SPARSE and (fields.get("normalize") is not None or fields.get("dimensions")):
        raise InvalidInput(
            "this model answers sparse (SPLADE) embeddings: normalize and dimensions apply to "
            "dense embeddings only"
        )
    params = embedding_params(
        info,
        truncate=fields.get("truncate"),
        direction=fields.get("truncation_direction"),
        prompt_name=fields.get("prompt_name"),
        normalize=fields.get("normalize"),
        dimensions=fields.get("dimensions"),
        default_truncate=settings.truncate,
    )
    units = [Unit(op=op, text=t, params=params) for t in _as_list(request.inputs)]
    paths = list_paths(request)
    if op is Op.ROWS:  # the pipeline's shape: [1, tokens, hidden] per input
        return Job(units, _rows_finish(_is_list(request)), paths)
    fmt = request.encoding_format
    is_list = _is_list(request)

    def finish(answers: list[Any]) -> Any:
        # A sparse answer as the spec's array of floats: the full vocabulary-wide vector
        # (`SparseEncoder.encode(..., convert_to_sparse_tensor=False)`); /embed_sparse sends
        # only the non-zero entries.
        vectors = [a.dense() for a in answers] if op is Op.SPARSE else answers
        out = encode_all(vectors, fmt)
        return out if is_list else [out[0]]

    headers = dimension_warning(info, params["dimensions"])
    return Job(units, finish, paths, headers)


def _rows_finish(is_list: bool) -> Any:
    def finish(answers: list[Any]) -> Any:
        rows = [[a] for a in answers]
        return rows if is_list else rows[0]

    return finish


def _merged(request: FeatureExtractionRequest) -> dict[str, Any]:
    """Root-level fields (the spec) and `parameters` (older clients): one set; a field given
    in both with different values is refused."""
    root = request.model_dump(
        exclude_none=True, include={"normalize", "prompt_name", "truncate", "dimensions"}
    )
    if request.truncation_direction is not None:
        root["truncation_direction"] = request.truncation_direction
    nested = pipeline_params(request.parameters)
    if "truncation" in nested:
        nested.setdefault("truncate", nested.pop("truncation"))
    for key in root.keys() & nested.keys():
        if root[key] != nested[key]:
            raise InvalidInput(f"{key} is given twice with different values (root, parameters)")
    return {**nested, **root}


def _similarity(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, SentenceSimilarityRequest)
    require(info, Op.EMBED, "sentence-similarity")
    params = request.parameters or SentenceSimilarityParams()
    unit_params = embedding_params(
        info,
        truncate=params.truncation,
        direction=None,
        prompt_name=params.prompt_name,
        default_truncate=settings.truncate,
    )
    texts_ = [request.inputs.source_sentence, *request.inputs.sentences]
    if len(texts_) > settings.max_client_batch_size:
        raise _too_many(len(texts_), settings.max_client_batch_size)
    units = [Unit(op=Op.EMBED, text=t, params=unit_params) for t in texts_]
    paths = ["inputs.source_sentence"] + [f"inputs.sentences[{i}]" for i in range(len(texts_) - 1)]
    return Job(units, cosine_to_first, paths)


def cosine_to_first(vectors: list[Any]) -> list[float]:
    """Cosine similarity of each vector after the first to the first (sentence-transformers'
    `util.cos_sim`: both sides L2-normalized, then a dot product)."""
    matrix = np.stack(vectors).astype(np.float32)
    norms = np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    unit = matrix / norms
    return [float(x) for x in unit[1:] @ unit[0]]


def _too_many(n: int, limit: int) -> Exception:
    return PayloadTooLarge(f"{n} inputs in one request; at most {limit} (MAX_CLIENT_BATCH_SIZE)")


# -- text-classification and zero-shot ---------------------------------------------------------
def _text_classification(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    assert isinstance(request, TextClassificationRequest)
    params = request.parameters or TextClassificationParams()
    unit_params = {
        "truncate": settings.truncate if params.truncation is None else params.truncation,
        "top_k": params.top_k,
        "function_to_apply": params.function_to_apply,
    }
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
    unit_params = {
        "truncate": settings.truncate if params.truncation is None else params.truncation,
        "strategy": "only_first",  # the pipeline's: never cut the hypothesis
    }
    units = [
        Unit(op=Op.LOGITS, text=seq, pair=hyp, params=unit_params)
        for seq in sequences
        for hyp in hypotheses
    ]

    def finish(logits: list[Any]) -> Any:
        n = len(labels)
        answers = [
            zero_shot_scores(logits[i * n : (i + 1) * n], labels, params.multi_label, info)
            for i in range(len(sequences))
        ]
        return answers if _is_list(request) else answers[0]

    return Job(units, finish, list_paths(request, per_input=len(labels)))


def hypothesis(template: str, label: str) -> str:
    """The hypothesis for `label`: the template's `{}` (or `{0}`) replaced by it, which is what
    the pipeline's `template.format(label)` gives for such templates. Any other brace is
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
    logits: Sequence[Any], labels: list[str], multi_label: bool, info: ModelInfo
) -> list[dict[str, Any]]:
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


# -- fill-mask and token-classification --------------------------------------------------------
def _pipeline_task(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    params: Params | None = getattr(request, "parameters", None)
    texts_ = _as_list(getattr(request, "inputs"))  # noqa: B009
    if info.mask_token is not None:
        _check_masks(texts_, info.mask_token, _is_list(request))
    unit_params = pipeline_params(params)
    units = [Unit(op=Op.PIPELINE, text=t, params=unit_params) for t in texts_]
    finish = (lambda a: a) if _is_list(request) else (lambda a: a[0])
    return Job(units, finish, list_paths(request))


def _check_masks(inputs: list[str], mask: str, is_list: bool) -> None:
    """Fill-mask: every input holds the mask token (cheap, on the loop; exact checks happen in
    the inference thread)."""
    for i, text in enumerate(inputs):
        if mask not in text:
            path = f"inputs[{i}]" if is_list else "input"
            raise InvalidInput(
                f"{path} has no mask token: fill-mask needs {mask} (this model's mask token) "
                "in every input"
            )


# -- answers (their JSON schemas go into /openapi.json; the routes build plain JSON) ---------
class Label(BaseModel):
    label: str
    score: float


class FillMaskPrediction(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


class Entity(BaseModel):
    """A token-classification entity: `entity` per token, or `entity_group` aggregated."""

    model_config = ConfigDict(extra="allow")
    score: float
    word: str
    start: int | None = None
    end: int | None = None
    entity: str | None = None
    entity_group: str | None = None
    index: int | None = None


class FeatureExtractionAnswer(
    RootModel[list[list[float]] | list[float] | list[str] | list[list[int]]]
):
    """One vector per input (a single input: a list holding one), as `encoding_format` asks
    (floats, base64 strings, packed binary bytes); a sparse (SPLADE) model: the full
    vocabulary-wide vector; sentence-similarity: one cosine similarity per sentence."""


class TokenRowsAnswer(RootModel[list[list[list[float]]] | list[list[list[list[float]]]]]):
    """Per input `[1, tokens, hidden]` (a single input: that alone)."""


class TextClassificationAnswer(RootModel[list[list[Label]]]):
    """One list of labels per input, highest first (a single input: a list holding one)."""


class ZeroShotAnswer(RootModel[list[Label] | list[list[Label]]]):
    """The candidate labels, highest first (a list of inputs: one such list each)."""


class FillMaskAnswer(RootModel[list[FillMaskPrediction] | list[list[FillMaskPrediction]]]):
    """The predictions (per mask, and per input for a list)."""


class TokenClassificationAnswer(RootModel[list[Entity] | list[list[Entity]]]):
    """The entities (a list of inputs: one list each)."""


def answer_model(info: ModelInfo) -> type[RootModel[Any]]:
    """The answer of `POST /` for the loaded model."""
    if info.task == "feature-extraction":
        dense = Op.EMBED in info.ops or info.sparse
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
    "cosine_to_first",
    "dimension_warning",
    "embedding_params",
    "invalid",
    "parse",
    "request_models",
]
