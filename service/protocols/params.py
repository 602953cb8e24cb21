"""Per-task allow-lists of user-facing parameters (the `parameters` object of `POST /`).

Only arguments a client may sensibly choose are accepted (never `batch_size`,
`num_workers`, `device` or `return_tensors`). Validation is strict: `"5"` and `2.5` are not an
integer `top_k` (`5.0` is, as JSON Schema reads it). `null` means "the default", as if the key
were absent. These models are validated as part of the request models
(`service.protocols.<task>.hf`)
and appear in /openapi.json.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.engine.params import PipelineParams
from service.protocols.schemas import INTEGRAL, Dimensions, NonBlank, Normalize, PromptName


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # Cut over-length inputs to the model's limit instead of answering 422 (default: TRUNCATE).
    truncation: bool | None = None


class FeatureExtractionParams(Params):
    """Also accepted here (the spec puts them at the body's root, which wins)."""

    truncate: bool | None = None
    normalize: Normalize | None = None
    prompt_name: PromptName | None = None
    truncation_direction: Literal["left", "right"] | None = None
    dimensions: Dimensions | None = None


class SentenceSimilarityParams(Params):
    prompt_name: PromptName | None = None


class FillMaskParams(Params):
    # Values above the vocabulary size are clamped to it by the inference thread.
    top_k: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    # At most MAX_FILL_MASK_PREDICTIONS targets: each is looked up, or tokenized, per request.
    targets: NonBlank | Annotated[list[NonBlank], Field(min_length=1, max_length=1000)] | None = (
        None
    )

    @field_validator("targets", mode="before")
    @classmethod
    def _targets_not_empty(cls, v: Any) -> Any:
        """Before the type checks, so an empty value gets this message (types come after)."""
        blank = isinstance(v, str) and not v.strip()
        blank_item = isinstance(v, list) and any(isinstance(t, str) and not t.strip() for t in v)
        if blank or v == [] or blank_item:
            raise ValueError("targets must be a non-empty string or a non-empty list of strings")
        return v


class TextClassificationParams(Params):
    # None: every label, highest score first (what the hosted API and InferenceClient show).
    top_k: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


class TokenClassificationParams(Params):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = None
    ignore_labels: list[str] | None = None


class ZeroShotParams(Params):
    # A list of labels, or one string of comma-separated labels (as the pipeline takes).
    candidate_labels: list[str] | str
    # `{}` (or `{0}`) where the label goes, no other braces
    # (`service.protocols.classification.hf.hypothesis`).
    hypothesis_template: str = Field("This example is {}.", max_length=1000)
    multi_label: bool = False


def pipeline_params(params: Params | None, *, truncate: bool) -> PipelineParams:
    """The pipeline engine's options (fill-mask, token-classification): the arguments that
    were set, and `truncation` (`truncate`, the server's TRUNCATE, where not set)."""
    arguments = {} if params is None else params.model_dump(exclude_none=True)
    truncation = arguments.pop("truncation", truncate)
    return PipelineParams.of(arguments, truncate=truncation)
