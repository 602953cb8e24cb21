"""The endpoints: parse -> admit -> submit -> encode, nothing more."""

from __future__ import annotations

import functools
import hmac
import platform
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.errors import InvalidInput, Unauthorized
from service.model import ModelInfo
from service.params import validate_parameters
from service.runtime import ClientGone, Runtime
from service.schemas import parse_body

_JSON = "application/json"


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """orjson-encoded JSON; numpy arrays (feature-extraction rows) are encoded directly."""
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback)
    return Response(body, status_code=status, headers=headers, media_type=_JSON)


def _fallback(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # torch tensors, non-contiguous arrays
        return obj.tolist()
    raise TypeError(type(obj).__name__)


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def require_api_key(request: Request) -> None:
    """401 unless API_KEY is unset or `Authorization: Bearer <key>` matches (constant time)."""
    key = _runtime(request).settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise Unauthorized(
            "missing or wrong API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _check_inputs(inputs: list[str], info: ModelInfo, is_list: bool) -> None:
    """Cheap task checks on the loop (exact token checks happen in the inference thread)."""
    if info.mask_token is None:
        return
    for i, text in enumerate(inputs):
        if info.mask_token not in text:
            path = f"inputs[{i}]" if is_list else "input"
            raise InvalidInput(
                f"{path} has no mask token: fill-mask needs {info.mask_token} "
                f"(this model's mask token) in every input"
            )


async def infer(request: Request) -> Response:
    runtime = _runtime(request)
    require_api_key(request)
    info = runtime.model_info()
    deadline = runtime.deadline(request)
    try:
        body = await runtime.receive(request, deadline)
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the log line keeps the count
    job = parse_body(
        body, request.headers.get("content-type"), runtime.settings.max_client_batch_size
    )
    params = validate_parameters(info.task, job.parameters)
    _check_inputs(job.inputs, info, job.is_list)
    request.state.inputs = len(job.inputs)
    items = runtime.submit(job.inputs, params, deadline)
    try:
        answers = await runtime.wait(items, request, deadline)
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the log line keeps the count
    return json_response(answers if job.is_list else answers[0])


async def readyz(request: Request) -> Response:
    ready, status = _runtime(request).ready()
    if ready:
        return json_response({"status": "ready"})
    return json_response({"status": status}, 503, {"Retry-After": "5"})


async def livez(request: Request) -> Response:
    live, status = _runtime(request).live()
    return json_response({"status": status}, 200 if live else 503)


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def info(request: Request) -> Response:
    require_api_key(request)
    runtime = _runtime(request)
    s = runtime.settings
    model = runtime.batcher.info
    return json_response(
        {
            "model": vars(model) if model else None,
            "state": runtime.batcher.state.value,
            "batching": {
                "max_batch_size": s.max_batch_size,
                "max_batch_wait_ms": s.max_batch_wait_ms,
                "max_batch_tokens": s.max_batch_tokens,
                "max_queue_size": s.max_queue_size,
                "max_client_batch_size": s.max_client_batch_size,
            },
            "limits": {
                "max_body_bytes": s.max_body_bytes,
                "request_timeout_s": s.request_timeout_s,
                "truncate": s.truncate,
                "drain_timeout_s": s.drain_timeout_s,
                "liveness_stall_s": s.liveness_stall_s,
            },
            "versions": _versions(),
        }
    )


@functools.cache
def _versions() -> dict[str, str]:
    """Package versions, read once (importlib.metadata scans site-packages)."""
    from importlib.metadata import version

    names = ("pipeline-server", "torch", "transformers", "tokenizers", "starlette", "uvicorn")
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except Exception:
            continue
    return {"python": platform.python_version(), **found}


ROUTES = [
    Route("/", infer, methods=["POST"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/livez", livez, methods=["GET"]),
    Route("/metrics", metrics_endpoint, methods=["GET"]),
    Route("/info", info, methods=["GET"]),
]
