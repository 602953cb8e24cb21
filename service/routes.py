"""The route table: each protocol's endpoints, the probes, /metrics and /info. Nothing more."""

from __future__ import annotations

import functools
import platform

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.protocols import hf
from service.protocols.serving import json_response, require_api_key, runtime_of, serve

#: Routes that submit model work: admission sheds them before the body is read (`service.shed`).
INFERENCE_PATHS = frozenset({"/"})


async def infer(request: Request) -> Response:
    return await serve(request, hf.parse)


async def readyz(request: Request) -> Response:
    ready, status = runtime_of(request).ready()
    if ready:
        return json_response({"status": "ready"})
    return json_response({"status": status}, 503, {"Retry-After": "5"})


async def livez(request: Request) -> Response:
    live, status = runtime_of(request).live()
    return json_response({"status": status}, 200 if live else 503)


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def info(request: Request) -> Response:
    require_api_key(request)
    runtime = runtime_of(request)
    s = runtime.settings
    model = runtime.batcher.info
    return json_response(
        {
            "model": model.summary() if model else None,
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
