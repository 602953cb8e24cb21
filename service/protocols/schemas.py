"""Request bodies: size limits, content types, UTF-8, and validation against the request models.

No sniffing: JSON needs a JSON content type; on `POST /` text/plain, form-urlencoded (what
`curl -d` sends), octet-stream or no content type make the whole body one input string.
Every protocol's request models (pydantic, `service.protocols.*`) are validated here, and
pydantic's errors become one message that names the offending path (`inputs[1]`,
`parameters.top_k`) or lists the accepted fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, TypeAlias, TypeVar

import orjson
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from service.errors import BadRequest, InvalidInput, PayloadTooLarge, UnsupportedMediaType

_RAW_TYPES = {"text/plain", "application/x-www-form-urlencoded", "application/octet-stream", ""}
_UTF8 = {"utf-8", "utf8", "us-ascii", "ascii"}

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

#: A JSON value as `orjson.loads` gives one (and as answers are written).
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None

# -- field types shared by the request models --------------------------------------------------
# The `x-*` keys mark where the OpenAPI document (`service.protocols.openapi`) fills in this
# deployment's values: MAX_CLIENT_BATCH_SIZE, the model's prompts, embedding width and vocabulary.
MAX_INPUTS = "x-max-inputs"  # an input list: maxItems = MAX_CLIENT_BATCH_SIZE - its value
PROMPT_NAME = "x-prompt-name"  # enum: the model's prompt names
JINA_TASK = "x-jina-task"  # enum: Jina's task names and the model's prompt names
DIMENSIONS = "x-dimensions"  # maximum: the model's embedding width
TOKEN_ID = "x-token-id"  # maximum: the model's vocabulary size - 1
DENSE_ONLY = "x-dense-only"  # dense-embedding options: only null on a sparse (SPLADE) model
LATE = "x-late-chunking"  # late_chunking: only false or null where the model cannot serve it


def _integral(value: object) -> object:
    """A JSON number with no fraction (`3.0`) is the integer it writes (JSON Schema's
    `integer`); anything else is left to the strict check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: The most tokens a request may name as a cut (`max_tokens`, `max_tokens_per_doc`): the
#: tokenizers' own limit is a machine word, and no model's window comes near this.
MAX_TOKENS = 2**31 - 1

#: Metadata for an integer as JSON Schema reads one: `3` or `3.0` (never `"3"`, `true` or
#: `3.5`). Put it after any `Field` constraints, so they stay JSON Schema (`minimum`).
INTEGRAL = BeforeValidator(_integral)
#: Text with something in it (empty and whitespace-only inputs are 422; the validators name them).
NonBlank = Annotated[str, Field(pattern=r"\S")]
PromptName = Annotated[str, Field(json_schema_extra={PROMPT_NAME: True})]
LateChunking = Annotated[bool, Field(json_schema_extra={LATE: True})]
JinaTask = Annotated[str, Field(max_length=100, json_schema_extra={JINA_TASK: True})]
Dimensions = Annotated[
    int, Field(ge=1, json_schema_extra={DIMENSIONS: True, DENSE_ONLY: True}), INTEGRAL
]
Normalize = Annotated[bool, Field(json_schema_extra={DENSE_ONLY: True})]
TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID: True}), INTEGRAL]


def inputs_list(reserved: int = 0) -> object:
    """`Field` metadata for a list of inputs (at least one; at most MAX_CLIENT_BATCH_SIZE less
    `reserved`, e.g. the source sentence of a similarity request)."""
    return Field(min_length=1, json_schema_extra={MAX_INPUTS: reserved})


class RawText(str):
    """A body sent as plain text (not JSON): the whole body is one input."""


def _request_in_text(text: str) -> dict[str, JSON] | None:
    """`text` parsed, when it is a JSON object with `inputs` (a JSON request sent as text)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and "inputs" in doc else None


def decode(body: bytes, content_type: str | None, *, raw_text: bool) -> JSON:
    """The JSON document, or (`raw_text` routes only) the whole body as `RawText`.

    On a raw-text route a body sent as text (text/plain, a form type, octet-stream, none) that
    parses as a JSON object with `inputs` is that object: it is a JSON request whose client did
    not say so (`curl -d` sends `application/x-www-form-urlencoded`), never a text to embed.
    Other text stays the one input. Raises 400 (invalid UTF-8, malformed JSON), 415 (a
    content type or charset not accepted) or 422 (raw text that is empty)."""
    media, _, rest = (content_type or "").partition(";")
    media = media.strip().lower()
    charset = _charset(rest)
    is_json = media == "application/json" or media.endswith("+json")
    if not is_json and not (raw_text and media in _RAW_TYPES):
        wanted = "application/json or text/plain" if raw_text else "application/json"
        raise UnsupportedMediaType(f"content type {media!r} is not supported; send {wanted}")
    if charset is not None and charset not in _UTF8:
        raise UnsupportedMediaType(f"charset {charset!r} is not supported; send UTF-8")
    if not is_json:
        text = _utf8(body)
        check_text(text, "input")
        return _request_in_text(text) or RawText(text)
    try:
        doc: JSON = orjson.loads(body)  # orjson checks UTF-8 itself: no decoded copy on the loop
        return doc
    except orjson.JSONDecodeError as exc:
        _utf8(body)  # invalid UTF-8 gets its own message
        raise BadRequest(f"malformed JSON: {exc}") from None


def validate(model: type[M], doc: object, *, what: str, max_inputs: int) -> M:
    """`doc` validated as `model`; raises 413 (too many inputs) or 422 with one message.

    `what` names the task or route in messages about parameters (`unknown parameter(s) for
    fill-mask: ...`); validators read `max_inputs` (MAX_CLIENT_BATCH_SIZE) from the context."""
    if not isinstance(doc, dict):
        raise InvalidInput(f"body must be a JSON object: {_shape(model)}")
    try:
        return model.model_validate(doc, strict=True, context={"max_inputs": max_inputs})
    except ValidationError as exc:
        raise InvalidInput(_message(model, exc, what)) from None


def _message(model: type[BaseModel], exc: ValidationError, what: str) -> str:
    errors = exc.errors()
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        where = tuple(_clean(extra[0]["loc"][:-1]))
        names = sorted(str(e["loc"][-1]) for e in extra if tuple(_clean(e["loc"][:-1])) == where)
        fields = _fields_at(model, where)
        if where == ("parameters",):
            return (
                f"unknown parameter(s) for {what}: {', '.join(names)}; "
                f"accepted: {', '.join(fields)}"
            )
        prefix = f"{_path(where)}: " if where else ""
        return f"{prefix}unknown field(s) {', '.join(names)}; accepted: {', '.join(fields)}"
    custom = next((e for e in errors if e["type"] == "invalid_input"), None)
    if custom is not None:
        return str(custom["msg"])
    err = errors[0]
    loc = _clean(err["loc"])
    if err["type"] == "missing":
        return f"{_path(loc)} is missing: it is required and may not be empty"
    if err["type"] in ("model_type", "dict_type", "model_attributes_type"):
        fields = _fields_at(model, tuple(loc))
        accepts = f"; {what} accepts: {', '.join(fields)}" if loc == ["parameters"] else ""
        return f"{_path(loc)} must be a JSON object{accepts}"
    return f"{_path(loc)}: {str(err['msg']).removeprefix('Value error, ')}"


def _clean(loc: Sequence[int | str]) -> list[int | str]:
    """Drop pydantic's union-member tags (`str`, `constrained-str`, `list[str]`, `TextPair`)
    from a location."""
    return [p for p in loc if not (isinstance(p, str) and _is_tag(p))]


def _is_tag(part: str) -> bool:
    return "[" in part or part[:1].isupper() or part in ("str", "int") or "-" in part


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _fields_at(model: type[BaseModel], where: Sequence[int | str]) -> list[str]:
    """The accepted field names of the (sub)model at `where` (by field names, not positions)."""
    current: type[BaseModel] = model
    for part in where:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        sub = _model_of(field.annotation) if field is not None else None
        if sub is None:
            return []
        current = sub
    return sorted(current.model_fields)


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _shape(model: type[BaseModel]) -> str:
    return "{" + ", ".join(f'"{name}": ...' for name in model.model_fields) + "}"


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body is not valid UTF-8") from None


def _charset(params: str) -> str | None:
    for part in params.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


# -- input validators shared by the request models (BeforeValidator functions) -------------
def invalid(message: str) -> PydanticCustomError:
    """An error whose message is shown as is (it names its own path)."""
    return PydanticCustomError("invalid_input", message)


def check_text(text: str, path: str) -> None:
    """Raise 422 for an input that is empty or only whitespace."""
    if not text.strip():
        raise InvalidInput(f"{path} is empty; send some text")


def texts(path: str, *, pairs: bool = False) -> Callable[[object, ValidationInfo], object]:
    """A validator for `str | list[str]` inputs at `path` (with `pairs`, also text-pair objects
    `{"text", "text_pair"}` and lists of them): types, emptiness and the client batch bound
    (413 past MAX_CLIENT_BATCH_SIZE), with messages naming the input."""
    one = "a string or a text pair object" if pairs else "a string"

    def check(value: object, info: ValidationInfo) -> object:
        if isinstance(value, list):
            for i, item in enumerate(check_list(value, path, info, "string")):
                _check_one(item, f"{path}[{i}]", one, pairs)
        elif isinstance(value, str) or (pairs and isinstance(value, dict)):
            _check_one(value, path, one, pairs)
        else:
            raise invalid(f"{path} must be {one} or a list of them, not {kind(value)}")
        return value

    return check


def _check_one(item: object, at: str, one: str, pairs: bool) -> None:
    if pairs and isinstance(item, dict):
        for key in ("text", "text_pair"):
            if isinstance(item.get(key), str) and not item[key].strip():
                raise invalid(f"{at}.{key} is empty; send some text")
        return  # the model validates its fields and types
    if not isinstance(item, str):
        raise invalid(f"{at} must be {one}, not {kind(item)}")
    if not item.strip():
        raise invalid(f"{at} is empty; send some text")


def check_list(value: list[T], path: str, info: ValidationInfo, one: str) -> list[T]:
    """A non-empty list within MAX_CLIENT_BATCH_SIZE (413 past it)."""
    if not value:
        raise invalid(f"{path} is an empty list; send at least one {one.split()[-1]}")
    limit = int((info.context or {}).get("max_inputs", len(value)))
    if len(value) > limit:
        raise PayloadTooLarge(
            f"{len(value)} inputs in one request; at most {limit} (MAX_CLIENT_BATCH_SIZE)"
        )
    return value


_KINDS = {
    int: "a number",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def kind(value: object) -> str:
    """How a JSON value's type reads in a message ("a number", "an object", "null")."""
    return _KINDS.get(type(value), type(value).__name__)


#: `inputs` of the Inference API and TEI: one text or a list of them.
Texts = Annotated[
    NonBlank | Annotated[list[NonBlank], inputs_list()], BeforeValidator(texts("inputs"))
]
