"""What every embedding dialect shares: unit parameters checked against the model (prompts and
input types, `dimensions`, encodings), the `Warning` for an untrained Matryoshka cut, and
sentence similarity (its inputs and the cosine to the first).

Input types (Cohere's `input_type`, also accepted as a `prompt_name`) map onto the folder's
sentence-transformers prompts: `search_query` is the `query` prompt (what `encode_query`
uses), `search_document` the `document` prompt (`encode_document`), `classification` and
`clustering` a prompt of that name. A folder without that prompt gets the plain text (not its
default prompt); a prompt of the folder named like an input type wins.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.config import JsonDict

from service.engine.jobs import Op, Unit
from service.engine.params import EmbedParams, Side
from service.engine.types import ModelInfo
from service.errors import InvalidInput
from service.protocols.encodings import needs_ranges
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
    direction: Side | None,
    prompt_name: str | None,
    normalize: bool | None = None,
    dimensions: int | None = None,
    long_inputs: str = "refuse",
    encodings: Any = None,
    dimensions_field: str = "dimensions",
    count_tokens: bool = False,
    max_tokens: int | None = None,
    max_active_dims: int | None = None,
) -> EmbedParams:
    """Options of `embed`/`rows`/`sparse` units, checked against the model: a prompt or input
    type it maps, a `dimensions` it can cut to (the width it emits, measured at start), int8/uint8
    among `encodings` only where it has calibrated ranges. Shared by every embedding
    protocol.

    `truncate` is the request's own choice (None: not said); `long_inputs` the server's mode
    (LONG_INPUTS) for inputs over the limit when the request does not say: `truncate` cuts,
    `chunk` embeds windows and averages them (`service.engine.forward.windows`), `refuse`
    answers 422. A request's `truncate: false` refuses, whatever the mode."""
    prompt = prompt_for(info, prompt_name)
    if dimensions is not None and info.dimension is not None and dimensions > info.dimension:
        raise InvalidInput(
            f"{dimensions_field} {dimensions} is more than the {info.dimension} dimensions this "
            "model emits; send at most that"
        )
    return EmbedParams(
        truncate=long_inputs == "truncate" if truncate is None else truncate,
        chunk=truncate is None and long_inputs == "chunk",
        direction=direction or "right",
        prompt_name=prompt,
        # Unset: as the model's own pipeline does (its Normalize module), which is what
        # SentenceTransformer.encode answers; True for POOLING on plain models (TEI's default).
        normalize=info.normalize if normalize is None else normalize,
        dimensions=dimensions,
        ranges=ranges_wanted(info, needs_ranges(encodings)),
        count_tokens=count_tokens,
        max_tokens=max_tokens,
        max_active_dims=max_active_dims,
    )


# -- late chunking ----------------------------------------------------------------------------
#: The request field (Jina's embeddings API's name and meaning), for `/openapi.json`.
LATE_CHUNKING = Field(
    None,
    description="the inputs are the chunks of one document, in order: they are joined with "
    "single spaces, encoded once, and each chunk's vector is the mean of its own tokens' "
    "embeddings in the whole document (late chunking); one vector per input. Documents "
    "longer than the model's window are encoded in overlapping windows (/info's "
    "limits.late_chunking)",
)


def late_chunking_schema(field: str) -> JsonDict:
    """What a request with `"late_chunking": true` must hold, in the schema too (clients and
    fuzzers read it): texts in `field` (not token ids), `truncate` not true, an encoding other
    than int8 and uint8 (`late_unit` refuses the rest). A chunk's token count (/info's
    limits.late_chunking) is the server's to check: no schema can say it."""
    text: JsonDict = {"type": "string", "pattern": r"\S"}
    return {
        "anyOf": [
            {
                "not": {
                    "properties": {"late_chunking": {"const": True}},
                    "required": ["late_chunking"],
                }
            },
            {
                "properties": {
                    field: {"anyOf": [text, {"type": "array", "items": text}]},
                    "truncate": {"not": {"const": True}},
                    "encoding_format": {"not": {"enum": ["int8", "uint8"]}},
                }
            },
        ]
    }


def late_unit(inputs: Any, params: EmbedParams, field: str, info: ModelInfo) -> Unit:
    """The one `embed` unit of a late-chunked document whose chunks are `inputs` (a validated
    `Input`: one text is one chunk): their text joined with single spaces and each chunk's
    character span in it (`late_chunks`). Its answer is float32 [chunks, D]. Never truncated
    nor chunked by LONG_INPUTS: a long document is windowed (`service.engine.forward.late`).

    Raises `InvalidInput` on a static embedding model, for token ids (the spans are the texts')
    and for int8/uint8 encodings (their ranges are those of whole texts' vectors)."""
    if info.static:
        raise InvalidInput(
            "late_chunking is not served by a static embedding model: its token vectors do not "
            "depend on their context, so each chunk's vector is the chunk's own (send the "
            "chunks as inputs)"
        )
    chunks = inputs if isinstance(inputs, list) else [inputs]
    if not all(isinstance(x, str) for x in chunks):
        raise InvalidInput(f"late_chunking takes texts: {field} holds token ids")
    if params.ranges:
        raise InvalidInput(
            "encoding_format int8 and uint8 are not served with late_chunking (their ranges are "
            "calibrated on whole texts' vectors); ask for float, base64, binary or ubinary"
        )
    spans, at = [], 0
    for text in chunks:
        spans.append((at, at + len(text)))
        at += len(text) + 1
    late = dataclasses.replace(params, truncate=False, chunk=False, late_chunks=tuple(spans))
    return Unit(op=Op.EMBED, text=" ".join(chunks), params=late)


#: Cohere's `input_type` -> the sentence-transformers prompt it means.
INPUT_TYPES = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
}


def prompt_names(info: ModelInfo) -> list[str]:
    """What `prompt_name` accepts on this model: its prompts, and on an embedding model the
    input types."""
    return sorted({*info.prompts, *(INPUT_TYPES if info.task == "feature-extraction" else ())})


def prompt_for(info: ModelInfo, name: str | None) -> str | None:
    """The unit's `prompt_name` for a requested prompt name or input type (see the module
    docstring): None asks for the model's default prompt, "" for none. Raises 422 for a name
    that is neither."""
    if name is None:
        return info.default_prompt_name
    if name in info.prompts:
        return name
    if name in INPUT_TYPES and info.task == "feature-extraction":
        target = INPUT_TYPES[name]
        return target if target in info.prompts else ""
    known = ", ".join(prompt_names(info)) or "none"
    raise InvalidInput(f"prompt_name {name!r} is not one of this model's prompts: {known}")


#: Jina's embeddings API `task` -> the sentence-transformers prompt it means on a folder without
#: a prompt of the task's own name (jina-embeddings-v3's prompts are named after its tasks):
#: a query or a document as `encode_query` / `encode_document` encode them, or a prompt of the
#: input type's name; "" is no prompt (`text-matching` is symmetric).
JINA_TASKS = {
    "retrieval.query": "query",
    "retrieval.passage": "document",
    "code.query": "query",
    "code.passage": "document",
    "separation": "clustering",
    "classification": "classification",
    "text-matching": "",
}


def task_names(info: ModelInfo) -> list[str]:
    """What `task` accepts on this model: Jina's tasks and the model's prompts."""
    return sorted({*JINA_TASKS, *info.prompts})


def task_prompt(info: ModelInfo, task: str) -> str:
    """The unit's `prompt_name` for Jina's `task`: the folder's prompt of that name, else the
    prompt the task means (`JINA_TASKS`) where the folder has it, else "" (the plain text, as
    an input type without its prompt). Raises 422 naming `task` for a name that is neither a
    prompt of the folder nor one of Jina's tasks."""
    if task in info.prompts:
        return task
    if task in JINA_TASKS:
        target = JINA_TASKS[task]
        return target if target in info.prompts else ""
    known = ", ".join(task_names(info))
    raise InvalidInput(
        f"task {task!r} is not one of Jina's tasks nor a prompt of this model: {known}"
    )


def ranges_wanted(info: ModelInfo, wanted: bool) -> bool:
    """The unit param `ranges` for int8/uint8 encodings: refused (422) on a model without
    calibrated ranges (sparse or token-row models)."""
    if wanted and info.calibration is None:
        raise InvalidInput(
            "int8 and uint8 need calibrated ranges, which only dense sentence embeddings have"
        )
    return wanted


def dimension_warning(
    info: ModelInfo, dimensions: int | None, field: str = "dimensions"
) -> dict[str, str] | None:
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
        "Warning": f'299 pipeline-server "{field} {dimensions} cuts a {full}-dimensional '
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
