"""`POST /embed_multi` (ours, in text-embeddings-inference's style): a multi-vector model's
token vectors, as `MultiVectorEncoder.encode_query` / `encode_document` answer them.

Request: `inputs` (a string or a list of strings), `input_type` (`query` or `document`:
which of the two encodings, with its prompt, length and masking), `truncate` (default: the
server's LONG_INPUTS; `false` refuses an input over the input type's length, `true` cuts it),
`pool_factor` and `protected_tokens` (token pooling, as
`encode_document(token_pooling=HierarchicalTokenPooling(pool_factor, num_protected_tokens=
protected_tokens))` answers; on a folder that ships a HierarchicalTokenPooling, in its place,
with its own options as the defaults; queries are left as they are, as sentence-transformers
leaves them, unless the folder's module names queries among its tasks). Answer: per input,
its list of token vectors (a single input: a list holding one), each `dimension` floats
(/info's `multi_vector`). Score them with MaxSim, or send the query and documents to
`/rerank`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.types import ModelInfo
from service.protocols.multi_vector.common import multi_vector_params
from service.protocols.schemas import INTEGRAL, Texts
from service.protocols.serving import Endpoint, needs
from service.protocols.tei_shapes import _parsed, _Request
from service.settings import Settings


class EmbedMultiRequest(_Request):
    inputs: Texts
    input_type: Literal["query", "document"] = Field(
        description="query or document: the encoding sentence-transformers' encode_query or "
        "encode_document gives"
    )
    truncate: bool | None = None
    pool_factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = Field(
        None,
        description="documents: keep about 1/pool_factor of each document's token vectors, "
        "similar ones merged by Ward clustering (sentence-transformers' "
        "HierarchicalTokenPooling); 1: none. Default: the model's own token pooling, if any. "
        "Queries are not pooled",
    )
    protected_tokens: Annotated[int, Field(ge=0), INTEGRAL] | None = Field(
        None,
        description="with token pooling: the leading token vectors never merged "
        "(sentence-transformers' num_protected_tokens). Default: the model's, else 1",
    )


class EmbedMultiResponse(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token the model keeps ([CLS], [SEP] and prompt tokens
    included; a document's skiplist tokens left out; a query's expansion tokens kept)."""


def _embed_multi(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: EmbedMultiRequest = _parsed(EmbedMultiRequest, body, content_type, "/embed_multi", s)
    pooled = {"pool_factor": r.pool_factor, "protected_tokens": r.protected_tokens}
    params = multi_vector_params(r.input_type, r.truncate, s, **pooled)
    texts = r.inputs if isinstance(r.inputs, list) else [r.inputs]
    units = [Unit(op=Op.MULTI_VECTOR, text=t, params=params) for t in texts]
    paths = [f"inputs[{i}]" for i in range(len(texts))] if isinstance(r.inputs, list) else None
    return Job(units, list, paths)


ENDPOINTS = (
    Endpoint(
        path="/embed_multi",
        summary="Multi-vector (ColBERT-style) token embeddings of queries or documents (ours)",
        parse=_embed_multi,
        check=needs(Op.MULTI_VECTOR, "/embed_multi"),
        request=EmbedMultiRequest,
        response=EmbedMultiResponse,
    ),
)
