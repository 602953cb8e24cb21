"""The one request path every protocol route goes through: parse -> admit -> submit -> encode.

A route is `serve(request, parse)`: the API key, readiness, the deadline and the body (with its
limits) are handled here the same way for every route; `parse(body, content type, model)`
is the protocol's adapter and returns the `Job`; its units are admitted all or none, awaited,
and `job.finish` turns their answers into the JSON response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from service.admission.api_key import authorized
from service.engine.jobs import Job, Op
from service.engine.types import ModelInfo, Output
from service.errors import Envelope, Unauthorized, WrongTask
from service.runtime.body import header
from service.runtime.runtime import ClientGone, Runtime
from service.settings import Settings

_JSON = "application/json"

#: A protocol adapter: (body, Content-Type, the loaded model, the settings) -> Job.
Parse = Callable[[bytes, str | None, ModelInfo, Settings], Job]


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One protocol route that submits model work: its adapter, the models its request is
    validated with and its answer is shaped as (the same ones make /openapi.json), and
    `check(info)`, which raises `WrongTask` (424) when the loaded model cannot serve it.

    `adapter` runs `check` before `parse`, so a client on the wrong route hears which task the
    model serves before anything about its body; the document lists only the routes whose
    `check` passes. `envelope`: the shape of its error bodies (its dialect's)."""

    path: str
    summary: str
    parse: Parse
    check: Callable[[ModelInfo], None]
    request: type[BaseModel]
    response: type[BaseModel]
    envelope: Envelope = Envelope.SERVICE
    # The request model /openapi.json shows for these settings, where it differs from
    # `request` (which parses): OpenAI's `input` without token ids while they are refused.
    documented: Callable[[Settings], type[BaseModel]] | None = None

    def request_model(self, settings: Settings) -> type[BaseModel]:
        """The request model /openapi.json documents under `settings`."""
        return self.request if self.documented is None else self.documented(settings)

    def serves(self, info: ModelInfo) -> bool:
        try:
            self.check(info)
        except WrongTask:
            return False
        return True

    def adapter(self) -> Parse:
        def parse(body: bytes, content_type: str | None, info: ModelInfo, s: Settings) -> Job:
            self.check(info)
            return self.parse(body, content_type, info, s)

        return parse


def needs(op: Op, route: str) -> Callable[[ModelInfo], None]:
    """An `Endpoint.check`: the model computes `op` (else 424 naming its task)."""
    return lambda info: require(info, op, route)


def json_response(
    content: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """orjson-encoded JSON; numpy arrays (embeddings, token rows) are encoded directly, in
    float32's shortest form."""
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback)
    return Response(body, status_code=status, headers=headers, media_type=_JSON)


def _fallback(obj: object) -> object:
    if hasattr(obj, "tolist"):  # torch tensors, non-contiguous arrays
        return obj.tolist()
    raise TypeError(type(obj).__name__)


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def require_api_key(request: Request) -> None:
    """401 unless API_KEY is unset or `Authorization: Bearer <key>` matches
    (`service.admission.api_key`)."""
    if not authorized(request.scope["headers"], runtime_of(request).settings.api_key):
        raise Unauthorized(
            "missing or wrong API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require(info: ModelInfo, op: Op, route: str) -> None:
    """424 naming the loaded task when the model cannot compute `op` (TEI answers 424 too)."""
    if op not in info.ops:
        raise WrongTask(f"{route} is not served by this deployment: {_serves(info)}")


def _serves(info: ModelInfo) -> str:
    what = {
        "feature-extraction": _embedding_kind(info),
        "text-classification": "a text classifier",
        "zero-shot-classification": "an NLI model for zero-shot classification",
    }.get(info.task, "a model")
    return f"it serves {info.task} ({what})"


def _embedding_kind(info: ModelInfo) -> str:
    if info.output is Output.SPARSE:
        return "a sparse (SPLADE) embedding model: use /embed_sparse or POST /"
    if info.output is Output.MULTI_VECTOR:
        return (
            "a multi-vector (ColBERT-style) model, whose answers are token vectors: use "
            "/embed_multi, or /rerank for its MaxSim scores"
        )
    return "an embedding model" if info.output is Output.POOLED else "token rows"


async def serve(request: Request, parse: Parse) -> Response:
    """parse -> admit -> submit -> encode, with the shared checks (see the module docstring).

    A client that leaves before its answer gets 499 in the log and metrics (nobody reads it)."""
    runtime = runtime_of(request)
    require_api_key(request)
    info = runtime.model_info()
    deadline = runtime.deadline(request)
    try:
        body = await runtime.receive(request, deadline)
    except ClientGone:
        return Response(status_code=499)
    job = parse(body, header(request.scope, b"content-type"), info, runtime.settings)
    request.scope["state"]["inputs"] = job.inputs
    deadline = runtime.job_deadline(request, deadline, len(job.units))
    try:
        answers = await runtime.run(job.units, request, deadline, job.paths)
    except ClientGone:
        return Response(status_code=499)
    return json_response(job.finish(answers), headers=dict(job.headers or {}) or None)
