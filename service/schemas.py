"""Parse a request body into inputs and parameters: size limits, content types, UTF-8, types.

No sniffing: JSON needs a JSON content type; text/plain, form-urlencoded (what
`curl -d` sends), octet-stream or no content type make the whole body one input string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request

from service.errors import BadRequest, InvalidInput, PayloadTooLarge, UnsupportedMediaType

_RAW_TYPES = {"text/plain", "application/x-www-form-urlencoded", "application/octet-stream", ""}
_UTF8 = {"utf-8", "utf8", "us-ascii", "ascii"}
_JSON_KEYS = ("inputs", "parameters")


@dataclass(frozen=True)
class Job:
    """A parsed request: `inputs` (1 or more strings), raw `parameters`, and whether the
    client sent a list (then the answer is a list in the same order)."""

    inputs: list[str]
    parameters: object
    is_list: bool


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it exceeds `limit` bytes: by Content-Length
    before reading, or while it streams in (chunked bodies have no Content-Length)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(
                f"body is {declared} bytes; the limit is {limit} (MAX_BODY_BYTES)"
            )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(body: bytes, content_type: str | None, max_inputs: int) -> Job:
    """Decode `body` by its content type. Raises 400 (undecodable), 413 (too many inputs),
    415 (unknown content type) or 422 (empty input, wrong JSON types, naming the path)."""
    media, _, rest = (content_type or "").partition(";")
    media = media.strip().lower()
    charset = _charset(rest)
    is_json = media == "application/json" or media.endswith("+json")
    if not is_json and media not in _RAW_TYPES:
        raise UnsupportedMediaType(
            f"content type {media!r} is not supported; send application/json or text/plain"
        )
    if charset is not None and charset not in _UTF8:
        raise UnsupportedMediaType(f"charset {charset!r} is not supported; send UTF-8")
    if not is_json:
        text = _utf8(body)
        _check_not_empty(text, "input")
        return Job(inputs=[text], parameters=None, is_list=False)
    try:
        doc = orjson.loads(body)  # orjson checks UTF-8 itself: no decoded copy on the loop
    except orjson.JSONDecodeError as exc:
        _utf8(body)  # invalid UTF-8 gets its own message
        raise BadRequest(f"malformed JSON: {exc}") from None
    return _from_json(doc, max_inputs)


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body is not valid UTF-8") from None


def _from_json(doc: Any, max_inputs: int) -> Job:
    if not isinstance(doc, dict):
        raise InvalidInput('body must be a JSON object: {"inputs": ..., "parameters": {...}}')
    unknown = sorted(set(doc) - set(_JSON_KEYS))
    if unknown:
        raise InvalidInput(f"unknown field(s) {', '.join(unknown)}; accepted: inputs, parameters")
    if "inputs" not in doc:
        raise InvalidInput("inputs is required (a string or a list of strings); it is empty")
    inputs = doc["inputs"]
    if isinstance(inputs, str):
        _check_not_empty(inputs, "inputs")
        return Job(inputs=[inputs], parameters=doc.get("parameters"), is_list=False)
    if not isinstance(inputs, list):
        raise InvalidInput(f"inputs must be a string or a list of strings, not {_kind(inputs)}")
    if not inputs:
        raise InvalidInput("inputs is an empty list; send at least one string")
    if len(inputs) > max_inputs:
        raise PayloadTooLarge(
            f"{len(inputs)} inputs in one request; at most {max_inputs} (MAX_CLIENT_BATCH_SIZE)"
        )
    for i, value in enumerate(inputs):
        if not isinstance(value, str):
            raise InvalidInput(f"inputs[{i}] must be a string, not {_kind(value)}")
        _check_not_empty(value, f"inputs[{i}]")
    return Job(inputs=inputs, parameters=doc.get("parameters"), is_list=True)


def _check_not_empty(text: str, path: str) -> None:
    if not text.strip():
        raise InvalidInput(f"{path} is empty; send some text")


def _charset(params: str) -> str | None:
    for part in params.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


_KINDS = {
    int: "a number",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)
