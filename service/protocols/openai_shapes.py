"""OpenAI's API shapes shared by its routes: `GET /v1/models` (the one model served) and the error
envelope every `/v1/*` route answers (`{"error": {"message", "type", "param", "code"}}`), as the
openai SDK reads them."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from service.protocols.serving import json_response, require_api_key, runtime_of

#: `created` of the one model in /v1/models: when this process started serving it.
_CREATED = int(time.time())
OWNED_BY = "pipeline-server"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class OpenAIError(BaseModel):
    message: str
    type: str = Field(description="our error_type, e.g. invalid_input")
    param: str | None
    code: int = Field(description="the HTTP status")


class OpenAIErrorResponse(BaseModel):
    error: OpenAIError


async def models(request: Request) -> Response:
    """`GET /v1/models`: the one model this server serves."""
    require_api_key(request)
    info = runtime_of(request).model_info()
    card = {"id": info.served_name, "object": "model", "created": _CREATED, "owned_by": OWNED_BY}
    return json_response({"object": "list", "data": [card]})
