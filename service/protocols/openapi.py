"""`GET /openapi.json`: an OpenAPI 3.1 document of the routes this deployment serves.

Generated from the same pydantic models the routes validate requests with (and the answer
models beside them in `service.protocols.*`), so it cannot drift from what is parsed. It lists
only the routes the loaded model serves (`Endpoint.serves`), and fills in what depends on the
deployment where the models mark it (`service.protocols.schemas`: the `x-*` keys):
MAX_CLIENT_BATCH_SIZE as `maxItems` of input lists, the model's prompt names (and on an
embedding model the input types) as the `prompt_name` enum, the width it emits as the
`dimensions` maximum, its vocabulary as the token-id maximum. Every operation lists its error
answers in its route's envelope (`Endpoint.envelope`: ours, OpenAI's, Cohere's) with
`Retry-After` on 503. `X-Request-Timeout` (a shorter deadline) is described, not listed as a
parameter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import orjson
from pydantic import BaseModel, Field
from pydantic.json_schema import JsonSchemaMode, JsonSchemaValue, models_json_schema

from service.engine.types import ModelInfo, Output
from service.errors import Envelope
from service.protocols import inference_api, schemas
from service.protocols.cohere_shapes import CohereError
from service.protocols.embedding.common import prompt_names, task_names
from service.protocols.openai_shapes import ModelList, OpenAIErrorResponse
from service.protocols.schemas import JSON
from service.protocols.serving import Endpoint
from service.settings import Settings

if TYPE_CHECKING:
    from pydantic._internal._dataclasses import PydanticDataclass

#: An OpenAPI object (an operation, a response, a schema) as it is built: JSON, by key.
Node: TypeAlias = dict[str, object]

_REF = "#/components/schemas/{model}"
_TEXT: dict[str, JSON] = {"type": "string", "pattern": r"\S"}
_HEADER_ID = {
    "description": "the request id (echoed if the client sent a sane one)",
    "schema": {"type": "string"},
}
_RETRY_AFTER = {
    "description": "seconds to wait before retrying",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9]+$"},
}
_WARNING = {
    "description": "299: `dimensions` cut a model not trained for Matryoshka cuts to that width",
    "schema": {"type": "string"},
}
#: The routes whose answers may carry the `Warning` header (a pooled model's embeddings).
_WARNED = ("/", "/embed", "/v1/embeddings", "/v2/embed")
_ERRORS = {
    400: "the body could not be decoded or parsed (invalid UTF-8, malformed JSON, a bad header)",
    401: "API_KEY is set and the bearer token is missing or wrong",
    413: "the body is over MAX_BODY_BYTES, or more inputs than MAX_CLIENT_BATCH_SIZE",
    415: "a content type that is not accepted here",
    422: "parsed but invalid: an empty input, a wrong type (the message names the path), an "
    "input over the model's token limit without truncation, an unknown field",
    424: "the loaded model cannot serve this request (the message names its task)",
    503: "shed (queue full, or the predicted wait exceeds the deadline), loading, or draining",
    504: "the request's deadline (REQUEST_TIMEOUT_S, or a shorter X-Request-Timeout) passed",
    500: "the model failed on this input (details in the server log)",
}
_MODEL_ERRORS = (400, 413, 415, 422, 503, 504, 500)


class ErrorResponse(BaseModel):
    error: str = Field(description="what went wrong, for a human")
    error_type: str
    request_id: str


class Status(BaseModel):
    status: str


#: Each envelope's error body model.
_ERROR_MODELS: dict[Envelope, type[BaseModel]] = {
    Envelope.SERVICE: ErrorResponse,
    Envelope.OPENAI: OpenAIErrorResponse,
    Envelope.COHERE: CohereError,
}

#: pydantic's: a model, its mode -> its $ref
Refs: TypeAlias = (
    "dict[tuple[type[BaseModel] | type[PydanticDataclass], JsonSchemaMode], JsonSchemaValue]"
)


def document_bytes(info: ModelInfo, settings: Settings, endpoints: Sequence[Endpoint]) -> bytes:
    """The document as JSON."""
    return orjson.dumps(document(info, settings, endpoints))


def document(info: ModelInfo, settings: Settings, endpoints: Sequence[Endpoint]) -> Node:
    """The OpenAPI 3.1 document for the loaded model (see the module docstring)."""
    served = [e for e in endpoints if e.serves(info)]
    hf_requests = inference_api.request_models(info)
    requests = {e.path: e.request_model(settings) for e in served}
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((m, "validation") for m in hf_requests),
        *((requests[e.path], "validation") for e in served),
        (inference_api.answer_model(info), "serialization"),
        *((e.response, "serialization") for e in served),
        *((m, "serialization") for m in _ERROR_MODELS.values()),
        (ModelList, "serialization"),
        (Status, "serialization"),
    ]
    refs, defs = models_json_schema(wanted, ref_template=_REF)
    components: Node = {"schemas": _specialize(defs.get("$defs", {}), info, settings)}
    secured = settings.api_key is not None
    paths = _model_paths(info, served, requests, refs, secured)
    paths.update(_own_routes(refs, secured))
    if secured:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "pipeline-server",
            "version": _version(),
            "description": (
                f"Serves one {info.task} model. Deadlines: REQUEST_TIMEOUT_S "
                f"({settings.request_timeout_s:g} s), or less with `X-Request-Timeout: <seconds>`."
            ),
        },
        "paths": paths,
        "components": components,
    }


def _model_paths(
    info: ModelInfo,
    served: Sequence[Endpoint],
    requests: dict[str, type[BaseModel]],
    refs: Refs,
    secured: bool,
) -> dict[str, Node]:
    """The operations of `POST /` and of each route in `served`; on a pooled model the
    embedding routes' answers list the `Warning` header."""
    hf_requests = inference_api.request_models(info)
    root_errors = (*_MODEL_ERRORS, 424) if info.task == "feature-extraction" else _MODEL_ERRORS
    pooled = info.output is Output.POOLED
    paths: dict[str, Node] = {}
    if info.output is not Output.MULTI_VECTOR:  # token vectors: POST / answers 424 there
        paths["/"] = {
            "post": _operation(
                "infer",
                f"Inference ({info.task}), the Hugging Face Inference API",
                _one_of([refs[(m, "validation")] for m in hf_requests]),
                refs[(inference_api.answer_model(info), "serialization")],
                errors=root_errors,
                secured=secured,
                raw_text=_raw_text(info),
                warning=pooled,
            )
        }
    for e in served:
        paths[e.path] = {
            "post": _operation(
                e.path.strip("/").replace("/", "_"),
                e.summary,
                refs[(requests[e.path], "validation")],
                refs[(e.response, "serialization")],
                errors=_MODEL_ERRORS,
                secured=secured,
                envelope=e.envelope,
                warning=pooled and e.path in _WARNED,
            )
        }
    return paths


def _raw_text(info: ModelInfo) -> JSON:
    """`POST /`'s text/plain body: some text (fill-mask: holding the mask token)."""
    return _with_pattern(_TEXT, re.escape(info.mask_token)) if info.mask_token else _TEXT


def _one_of(refs: list[Node]) -> Node:
    return refs[0] if len(refs) == 1 else {"oneOf": refs}


def _operation(
    operation_id: str,
    summary: str,
    request: Node | None,
    answer: Node,
    *,
    errors: Sequence[int],
    secured: bool,
    envelope: Envelope = Envelope.SERVICE,
    raw_text: JSON = None,
    warning: bool = False,
) -> Node:
    op: Node = {
        "operationId": operation_id,
        "summary": summary,
        "responses": {
            **_answer_response(answer, warning=warning),
            **_error_responses(errors, secured=secured, envelope=envelope),
        },
    }
    if request is not None:
        content: Node = {"application/json": {"schema": request}}
        if raw_text:
            content["text/plain"] = {"schema": raw_text}
        op["requestBody"] = {"required": True, "content": content}
    if secured:
        op["security"] = [{"bearer": []}]
    return op


def _answer_response(
    answer: Node, *, warning: bool = False, media: str = "application/json"
) -> dict[str, Node]:
    """The 200 response (with `warning`, listing the `Warning` header)."""
    headers: Node = {"X-Request-ID": _HEADER_ID}
    if warning:
        headers["Warning"] = _WARNING
    return {
        "200": {
            "description": "the answer",
            "headers": headers,
            "content": {media: {"schema": answer}},
        }
    }


def _error_responses(statuses: Sequence[int], *, secured: bool, envelope: Envelope) -> Node:
    schema = {"$ref": _REF.format(model=_ERROR_MODELS[envelope].__name__)}
    out: Node = {}
    for status in sorted({*statuses, *((401,) if secured else ())}):
        headers: Node = {"X-Request-ID": _HEADER_ID}
        if status == 503:
            headers["Retry-After"] = _RETRY_AFTER
        out[str(status)] = {
            "description": _ERRORS[status],
            "headers": headers,
            "content": {"application/json": {"schema": schema}},
        }
    return out


def _own_routes(refs: Refs, secured: bool) -> dict[str, Node]:
    """The probes, /metrics, /info, /openapi.json and /v1/models."""
    status = refs[(Status, "serialization")]
    anything: Node = {"type": "object"}
    probe_headers: Node = {"X-Request-ID": _HEADER_ID, "Retry-After": _RETRY_AFTER}
    return {
        "/readyz": _get(
            "readyz",
            "Readiness: 200 once the model is loaded and warm",
            status,
            (500,),
            unready=("loading, draining or failed", probe_headers),
        ),
        "/livez": _get(
            "livez",
            "Liveness: the inference thread is alive and not stuck",
            status,
            (500,),
            unready=(
                "the inference thread died, the load failed, or a batch is stuck",
                {"X-Request-ID": _HEADER_ID},
            ),
        ),
        "/metrics": _get(
            "metrics", "Prometheus metrics", {"type": "string"}, (500,), media="text/plain"
        ),
        "/info": _get("info", "The model, batching and limits", anything, (500,), key=secured),
        "/openapi.json": _get("openapi", "This document", anything, (503, 500)),
        "/v1/models": _get(
            "v1_models",
            "The served model (OpenAI)",
            refs[(ModelList, "serialization")],
            (503, 500),
            envelope=Envelope.OPENAI,
            key=secured,
        ),
    }


def _get(
    operation_id: str,
    summary: str,
    answer: Node,
    errors: Sequence[int],
    *,
    envelope: Envelope = Envelope.SERVICE,
    media: str = "application/json",
    unready: tuple[str, Node] | None = None,
    key: bool = False,
) -> Node:
    """A `GET` route's item: a probe's 503 (`unready`: its description and headers, with the
    answer's schema), or (`key`) the bearer token and its 401."""
    responses: Node = {
        **_answer_response(answer, media=media),
        **_error_responses(errors, secured=False, envelope=envelope),
    }
    if unready is not None:
        description, headers = unready
        responses["503"] = {
            "description": description,
            "headers": headers,
            "content": {"application/json": {"schema": answer}},
        }
    op: Node = {"operationId": operation_id, "summary": summary, "responses": responses}
    if key:
        op["security"] = [{"bearer": []}]
        responses.update(_error_responses((401,), secured=True, envelope=envelope))
    return {"get": op}


def _specialize(schemas_: dict[str, JSON], info: ModelInfo, settings: Settings) -> dict[str, JSON]:
    """Fill in this deployment's values where the models mark them (see
    `service.protocols.schemas`)."""

    def walk(node: JSON) -> JSON:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        node = {k: walk(v) for k, v in node.items()}
        reserved = node.pop(schemas.MAX_INPUTS, None)
        if isinstance(reserved, int):
            node["maxItems"] = settings.max_client_batch_size - reserved
        if node.pop(schemas.PROMPT_NAME, None):
            names = prompt_names(info)
            node = {**node, "enum": list(names)} if names else {"not": {}}
        if node.pop(schemas.JINA_TASK, None):
            node = {**node, "enum": list(task_names(info))}
        if node.pop(schemas.LATE, None) and info.static:
            return {"const": False}  # a static model's token vectors know no context
        if node.pop(schemas.DENSE_ONLY, None) and info.output is Output.SPARSE:
            return {"not": {}}  # the null beside it stays: a sparse model takes only null
        if node.pop(schemas.DIMENSIONS, None) and info.dimension is not None:
            node["maximum"] = info.dimension
        if node.pop(schemas.TOKEN_ID, None):
            node["maximum"] = info.vocab_size - 1
        return node

    out = {name: walk(schema) for name, schema in schemas_.items()}
    if info.mask_token:  # fill-mask: every input holds the mask token
        for schema in out.values():
            properties = schema.get("properties") if isinstance(schema, dict) else None
            if isinstance(properties, dict) and "inputs" in properties:
                properties["inputs"] = _with_pattern(
                    properties["inputs"], re.escape(info.mask_token)
                )
    return out


def _with_pattern(node: JSON, pattern: str) -> JSON:
    """`node` with each text's pattern (`\\S`) replaced by `pattern`."""
    if isinstance(node, list):
        return [_with_pattern(x, pattern) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: _with_pattern(v, pattern) for k, v in node.items()}
    if node.get("pattern") == _TEXT["pattern"]:
        node["pattern"] = pattern
    return node


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeline-server")
    except PackageNotFoundError:
        return "0"
