"""`POST /embed_hybrid` (ours, in text-embeddings-inference's style): a BGE-M3 model's dense,
sparse and multi-vector embeddings of the same inputs, any set of the three, from one forward
pass per batch (`service.engine.pooling.m3`), as FlagEmbedding's
`BGEM3FlagModel.encode(return_dense, return_sparse, return_colbert_vecs)` answers them.

Request: `inputs` (as `/embed`'s), `dense` (default true), `sparse` (default true),
`multi_vector` (default false): which outputs; at least one. `truncate`,
`truncation_direction`, `prompt_name` as `/embed`'s; `normalize` (the dense vector's; default
the model's: normalized); `max_active_dims` (the sparse vector's k largest weights).
Answer: one object per input (a single input: a list holding one) with the asked keys only:
`dense` (as `/embed` answers it), `sparse` (as `/embed_sparse`: `{index, value}` by token id,
ascending), `multi_vector` (as `/embed_multi`: one vector per token but the first).
A model without these heads answers 424 (its own routes give what it has).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.config import JsonDict

from service.engine.jobs import Job, Op
from service.engine.types import ModelInfo
from service.errors import InvalidInput
from service.protocols.embedding.common import embedding_params
from service.protocols.embedding.tei import SparseValue
from service.protocols.schemas import INTEGRAL, PromptName
from service.protocols.serving import Endpoint, needs
from service.protocols.tei_shapes import Direction, Input, _direction, _parsed, _Request, units
from service.settings import Settings

Output = Literal["dense", "sparse", "multi_vector"]
OUTPUTS: tuple[Output, ...] = ("dense", "sparse", "multi_vector")


def _asked(name: str, default: bool) -> JsonDict:
    """The schema of "`name` is asked": true when sent, or not sent where it defaults true."""
    if default:
        return {"not": {"properties": {name: {"const": False}}, "required": [name]}}
    return {"properties": {name: {"const": True}}, "required": [name]}


class EmbedHybridRequest(_Request):
    # At least one output asked, in the schema too (clients and fuzzers read it).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [_asked("dense", True), _asked("sparse", True), _asked("multi_vector", False)]
        }
    )

    inputs: Input
    dense: bool = Field(True, description="the dense (CLS) vector, as /embed answers it")
    sparse: bool = Field(True, description="the lexical weights, as /embed_sparse answers them")
    multi_vector: bool = Field(
        False, description="the ColBERT token vectors, as /embed_multi answers them"
    )
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName | None = None
    normalize: bool | None = Field(None, description="the dense vector's (default: normalized)")
    max_active_dims: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        None, description="keep the sparse vector's k largest weights"
    )


class HybridEmbedding(BaseModel):
    """One input's asked outputs (a key not asked is absent)."""

    dense: list[float] | None = None
    sparse: list[SparseValue] | None = None
    multi_vector: list[list[float]] | None = None


class EmbedHybridResponse(RootModel[list[HybridEmbedding]]):
    """One object per input, in order."""


def _embed_hybrid(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedHybridRequest = _parsed(EmbedHybridRequest, body, content_type, "/embed_hybrid", s)
    asked = tuple(name for name in OUTPUTS if getattr(r, name))
    if not asked:
        raise InvalidInput("dense, sparse and multi_vector are all false: ask for at least one")
    params = embedding_params(
        info,
        truncate=r.truncate,
        direction=_direction(r.truncation_direction),
        prompt_name=r.prompt_name,
        normalize=r.normalize,
        long_inputs=s.long_inputs,
        max_active_dims=r.max_active_dims,
    )
    params = dataclasses.replace(params, outputs=asked)
    return Job(units(Op.HYBRID, r.inputs, params), _shaped)


def _shaped(answers: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each answer with its sparse vector as `{index, value}` pairs."""
    return [
        {k: v.pairs() if k == "sparse" else v for k, v in a.items()}  # type: ignore[attr-defined]
        for a in answers
    ]


ENDPOINTS = (
    Endpoint(
        path="/embed_hybrid",
        summary="Dense, sparse and multi-vector embeddings from one forward pass (BGE-M3; ours)",
        parse=_embed_hybrid,
        check=needs(Op.HYBRID, "/embed_hybrid"),
        request=EmbedHybridRequest,
        response=EmbedHybridResponse,
    ),
)
