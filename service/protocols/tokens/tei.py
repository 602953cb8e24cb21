"""text-embeddings-inference's `/tokenize` and `/decode`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, RootModel

from service.engine.jobs import Job, Op, Unit
from service.engine.params import TokenParams
from service.engine.types import ModelInfo
from service.protocols.embedding.common import prompt_for
from service.protocols.schemas import (
    PromptName,
    Texts,
    inputs_list,
)
from service.protocols.serving import Endpoint, needs
from service.protocols.tei_shapes import TokenIds, _ids_inputs, _is_ids, _parsed, _Request, units
from service.settings import Settings


class TokenizeRequest(_Request):
    inputs: Texts
    add_special_tokens: bool | None = None
    prompt_name: PromptName | None = None


class DecodeRequest(_Request):
    ids: Annotated[
        TokenIds | Annotated[list[TokenIds], inputs_list()], BeforeValidator(_ids_inputs)
    ]
    skip_special_tokens: bool | None = None


class SimpleToken(BaseModel):
    id: int = Field(ge=0)
    text: str
    special: bool
    start: int | None = Field(ge=0, description="UTF-8 byte offset; null for special tokens")
    stop: int | None = Field(ge=0, description="UTF-8 byte offset; null for special tokens")


class TokenizeResponse(RootModel[list[list[SimpleToken]]]):
    """One list of tokens per input (a single input: a list holding one)."""


class DecodeResponse(RootModel[list[str]]):
    """One text per list of ids (a single list: a list holding one)."""


def _tokenize(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: TokenizeRequest = _parsed(TokenizeRequest, body, content_type, "/tokenize", s)
    params = TokenParams(
        add_special_tokens=r.add_special_tokens is not False,
        prompt_name=prompt_for(info, r.prompt_name),
    )
    return Job(units(Op.TOKENIZE, r.inputs, params))


def _decode(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
    r: DecodeRequest = _parsed(DecodeRequest, body, content_type, "/decode", s)
    lists: list[Any] = [r.ids] if _is_ids(r.ids) else list(r.ids)
    params = TokenParams(skip_special_tokens=r.skip_special_tokens is not False)
    return Job([Unit(op=Op.DECODE, ids=tuple(ids), params=params) for ids in lists])


ENDPOINTS = (
    Endpoint(
        path="/tokenize",
        summary="Tokenize inputs (TEI)",
        parse=_tokenize,
        check=needs(Op.TOKENIZE, "/tokenize"),
        request=TokenizeRequest,
        response=TokenizeResponse,
    ),
    Endpoint(
        path="/decode",
        summary="Decode token ids (TEI)",
        parse=_decode,
        check=needs(Op.DECODE, "/decode"),
        request=DecodeRequest,
        response=DecodeResponse,
    ),
)
