"""Cohere's v2 API shapes shared by its task codecs (`/v2/embed`, `/v2/rerank`): the request
base, the answer's `id` and `meta`, and the error body.

The `cohere` SDK (7.x, `cohere.ClientV2(base_url=...)`) is the spec: its generated types
(`cohere/types/`, `cohere/v2/types/`) name every field. Errors on `/v2/*` answer Cohere's body
`{"id", "message"}` (`service.errors.Envelope.COHERE`): the SDK raises its `ApiError` subclass for
the status (`BadRequestError`, `UnprocessableEntityError`, `ServiceUnavailableError`, ...) with
that body, and the request id stays in `X-Request-ID`.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

API_VERSION = "2"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    input_tokens: int = Field(ge=0, description="tokens the inputs took with this model")


class Meta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits


class CohereError(BaseModel):
    """Cohere's error body."""

    id: str = Field(description="the request id (as X-Request-ID)")
    message: str = Field(description="what went wrong, for a human")


def answer_id() -> str:
    """A new UUID for an answer's `id`, as Cohere's are."""
    return str(uuid.uuid4())


def meta(input_tokens: int) -> dict[str, Any]:
    """`meta`: the API version and the tokens the inputs took (`billed_units.input_tokens`,
    what clients read as usage; nothing is billed)."""
    return {"api_version": {"version": API_VERSION}, "billed_units": {"input_tokens": input_tokens}}
