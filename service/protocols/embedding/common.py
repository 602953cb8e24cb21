"""What every embedding dialect shares: unit parameters checked against the model, the `Warning`
for a
untrained Matryoshka cut, and sentence similarity (its inputs and the cosine to the first).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict

from service.engine.types import ModelInfo
from service.errors import InvalidInput
from service.protocols.schemas import (
    NonBlank,
    check_list,
    inputs_list,
    texts,
)


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


# -- feature-extraction and sentence-similarity ----------------------------------------------
def embedding_params(
    info: ModelInfo,
    *,
    truncate: bool | None,
    direction: str | None,
    prompt_name: str | None,
    normalize: bool | None = None,
    dimensions: int | None = None,
    long_inputs: str = "refuse",
) -> dict[str, Any]:
    """Unit params for `embed`/`rows`, checked against the model: a prompt it names, a
    `dimensions` it can cut to. Shared by every embedding protocol.

    `truncate` is the request's own choice (None: not said); `long_inputs` the server's mode
    (LONG_INPUTS) for inputs over the limit when the request does not say: `truncate` cuts,
    `chunk` embeds windows and averages them (`service.engine.forward.windows`), `refuse`
    answers 422. A request's `truncate: false` refuses, whatever the mode."""
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
        "truncate": long_inputs == "truncate" if truncate is None else truncate,
        "chunk": truncate is None and long_inputs == "chunk",
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


def cosine_to_first(vectors: list[Any]) -> list[float]:
    """Cosine similarity of each vector after the first to the first (sentence-transformers'
    `util.cos_sim`: both sides L2-normalized, then a dot product)."""
    matrix = np.stack(vectors).astype(np.float32)
    norms = np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    unit = matrix / norms
    return [float(x) for x in unit[1:] @ unit[0]]
