"""The Inference API's fill-mask and token-classification tasks on `POST /` (the pipeline's own
pre- and
post-processing).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.errors import InvalidInput
from service.protocols.hf_shapes import _as_list, _is_list, _Request, list_paths
from service.protocols.params import (
    FillMaskParams,
    Params,
    TokenClassificationParams,
    pipeline_params,
)
from service.protocols.schemas import Texts
from service.settings import Settings


class FillMaskRequest(_Request):
    inputs: Texts
    parameters: FillMaskParams | None = None


class TokenClassificationRequest(_Request):
    inputs: Texts
    parameters: TokenClassificationParams | None = None


# -- fill-mask and token-classification --------------------------------------------------------
def _pipeline_task(request: _Request, info: ModelInfo, settings: Settings) -> Job:
    params: Params | None = getattr(request, "parameters", None)
    texts_ = _as_list(getattr(request, "inputs"))  # noqa: B009
    if info.mask_token is not None:
        _check_masks(texts_, info.mask_token, _is_list(request))
    unit_params = pipeline_params(params, truncate=settings.truncate)
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


class FillMaskAnswer(RootModel[list[FillMaskPrediction] | list[list[FillMaskPrediction]]]):
    """The predictions (per mask, and per input for a list)."""


class TokenClassificationAnswer(RootModel[list[Entity] | list[list[Entity]]]):
    """The entities (a list of inputs: one list each)."""
