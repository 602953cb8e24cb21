"""Per-task allow-lists of user-facing pipeline parameters, validated on the event loop.

Only arguments a client may sensibly choose are accepted (never `batch_size`,
`num_workers`, `device` or `return_tensors`). Validation is strict: `"5"` and `2.5` are not an
integer `top_k`. `null` means "the pipeline's default", as if the key were absent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.errors import InvalidInput

Hashable = tuple[tuple[str, Any], ...]
SUPPORTED_TASKS = ("feature-extraction", "fill-mask", "text-classification", "token-classification")
TASK_ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # Cut over-length inputs to the model's limit instead of answering 422 (default: TRUNCATE).
    truncation: bool | None = None


class FeatureExtractionParams(_Params):
    pass


class FillMaskParams(_Params):
    # Values above the vocabulary size are clamped to it by the inference thread.
    top_k: int | None = Field(None, ge=1)
    targets: str | list[str] | None = None

    @field_validator("targets")
    @classmethod
    def _targets_not_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is not None and (len(v) == 0 or any(not t.strip() for t in v if isinstance(v, list))):
            raise ValueError("targets must be a non-empty string or a non-empty list of strings")
        if isinstance(v, str) and not v.strip():
            raise ValueError("targets must be a non-empty string or a non-empty list of strings")
        return v


class TextClassificationParams(_Params):
    top_k: int | None = Field(None, ge=1)
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


class TokenClassificationParams(_Params):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = None
    ignore_labels: list[str] | None = None


PARAMS_BY_TASK: dict[str, type[_Params]] = {
    "feature-extraction": FeatureExtractionParams,
    "fill-mask": FillMaskParams,
    "text-classification": TextClassificationParams,
    "token-classification": TokenClassificationParams,
}


def accepted_parameters(task: str) -> list[str]:
    """The parameter names `task` accepts, sorted."""
    return sorted(PARAMS_BY_TASK[task].model_fields)


def validate_parameters(task: str, raw: object) -> dict[str, Any]:
    """Check `raw` (the request's `parameters`) for `task`; return only the keys that were set.

    Raises `InvalidInput` (422) naming unknown keys with the accepted ones, or the bad value's path.
    """
    if raw is None:
        return {}
    accepted = accepted_parameters(task)
    if not isinstance(raw, dict):
        raise InvalidInput(
            f"parameters must be a JSON object; {task} accepts: {', '.join(accepted)}"
        )
    unknown = sorted(set(raw) - set(accepted))
    if unknown:
        raise InvalidInput(
            f"unknown parameter(s) for {task}: {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted)}"
        )
    try:
        model = PARAMS_BY_TASK[task].model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        # Drop pydantic's union-member tags (`targets.str`, `targets.list[str]`) from the path.
        loc = [p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p == "str"))]
        path = ".".join(str(p) for p in ("parameters", *loc))
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InvalidInput(f"{path}: {msg}") from None
    return model.model_dump(exclude_none=True)


def params_key(params: dict[str, Any]) -> Hashable:
    """A hashable key for a validated parameter set: items with equal keys share a batch."""

    def freeze(v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    return tuple(sorted((k, freeze(v)) for k, v in params.items()))
