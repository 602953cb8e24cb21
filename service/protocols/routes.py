"""The route table: each protocol's endpoints, the probes, /metrics, /info and /openapi.json.
Nothing more."""

from __future__ import annotations

import functools
import platform

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.engine.jobs import Op
from service.engine.types import ModelInfo, late_limits
from service.errors import Envelope
from service.protocols import inference_api, openai_shapes, openapi
from service.protocols.classification import tei as classification_tei
from service.protocols.embedding import cohere as embedding_cohere
from service.protocols.embedding import hybrid as embedding_hybrid
from service.protocols.embedding import openai
from service.protocols.embedding import tei as embedding_tei
from service.protocols.multi_vector import tei as multi_vector_tei
from service.protocols.rerank import cohere as rerank_cohere
from service.protocols.rerank import jina as rerank_jina
from service.protocols.rerank import tei as rerank_tei
from service.protocols.serving import Endpoint, json_response, require_api_key, runtime_of, serve
from service.protocols.tokens import tei as tokens_tei

#: The TEI, OpenAI, Cohere and Jina routes that submit model work (POST), in the document's
#: order.
ENDPOINTS: tuple[Endpoint, ...] = (
    *embedding_tei.ENDPOINTS,
    *embedding_hybrid.ENDPOINTS,
    *multi_vector_tei.ENDPOINTS,
    *classification_tei.ENDPOINTS,
    *rerank_tei.ENDPOINTS,
    *tokens_tei.ENDPOINTS,
    *openai.ENDPOINTS,
    *rerank_jina.ENDPOINTS,
    *embedding_cohere.ENDPOINTS,
    *rerank_cohere.ENDPOINTS,
)
#: Routes that submit model work: admission sheds them before the body is read
#: (`service.admission.policy`).
INFERENCE_PATHS = frozenset({"/", *(e.path for e in ENDPOINTS)})
#: Each route's error envelope where it is not ours: its Endpoint's, and OpenAI's models list.
ENVELOPES = {
    **{e.path: e.envelope for e in ENDPOINTS if e.envelope is not Envelope.SERVICE},
    "/v1/models": Envelope.OPENAI,
}
#: A path no route serves answers 404 in the envelope of the dialect its prefix names (an
#: OpenAI client that asks `/v1/nothing` reads OpenAI's).
_PREFIXES = (("/v1/", Envelope.OPENAI), ("/v2/", Envelope.COHERE))


def envelope_of(path: str) -> Envelope:
    """The error envelope of a request to `path`."""
    found = ENVELOPES.get(path)
    if found is not None:
        return found
    return next((e for prefix, e in _PREFIXES if path.startswith(prefix)), Envelope.SERVICE)


async def infer(request: Request) -> Response:
    return await serve(request, inference_api.parse)


def _route(endpoint: Endpoint) -> Route:
    parse = endpoint.adapter()

    async def route(request: Request) -> Response:
        return await serve(request, parse)

    return Route(endpoint.path, route, methods=["POST"], name=endpoint.path)


async def openapi_json(request: Request) -> Response:
    """The OpenAPI document of this deployment's routes; 503 while the model loads (the routes
    depend on its task). Public, like /metrics: it names the task, not the model."""
    runtime = runtime_of(request)
    info = runtime.model_info()
    state = request.app.state  # built once per loaded model
    cached: tuple[ModelInfo, bytes] | None = getattr(state, "openapi", None)
    if cached is None or cached[0] is not info:
        cached = state.openapi = (info, openapi.document_bytes(info, runtime.settings, ENDPOINTS))
    return Response(cached[1], media_type="application/json")


async def readyz(request: Request) -> Response:
    ready, status = runtime_of(request).ready()
    if ready:
        return json_response({"status": "ready"})
    return json_response({"status": status}, 503, {"Retry-After": "5"})


async def livez(request: Request) -> Response:
    """200 `{"status": "alive"}` (loading included: a word readiness never uses), else 503
    with the reason."""
    live, status = runtime_of(request).live()
    return json_response({"status": "alive" if live else status}, 200 if live else 503)


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def info(request: Request) -> Response:
    require_api_key(request)
    runtime = runtime_of(request)
    s = runtime.settings
    model = runtime.inference.info
    return json_response(
        {
            "model": model.summary() if model else None,
            "state": runtime.inference.state.value,
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
                "long_inputs": {
                    "mode": s.long_inputs,
                    "max_input_tokens": model.limit if model else None,
                },
                "late_chunking": late_limits(model.max_input_tokens)
                if model and Op.EMBED in model.ops and not model.static
                else None,
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
    Route("/openapi.json", openapi_json, methods=["GET"]),
    *(_route(e) for e in ENDPOINTS),
    Route("/v1/models", openai_shapes.models, methods=["GET"]),
]
