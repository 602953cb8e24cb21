"""Direct routes: the model routes' POSTs reach their handler without the router, and answer
what the router's way answers (floats within 1e-6); everything else still goes through the
router."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_ready
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from service.app import create_app
from service.errors import BadRequest, ServiceError
from service.http.direct import DirectRoutes, post_handlers
from service.protocols.routes import INFERENCE_PATHS, ROUTES
from service.settings import Settings


def test_the_table_is_the_model_routes() -> None:
    assert set(post_handlers(ROUTES)) == INFERENCE_PATHS


class Inner:
    """The router's place: records what reached it."""

    def __init__(self) -> None:
        self.reached: list[tuple[str, str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached.append((scope["method"], scope["path"], scope.get("root_path", "")))
        await PlainTextResponse("router")(scope, receive, send)


async def _handler(request: Request) -> Response:
    what = request.headers.get("x-what")
    if what == "bad":
        raise BadRequest("a bad request")
    if what == "bug":
        raise RuntimeError("a bug")
    return PlainTextResponse("direct")


async def _on_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return PlainTextResponse(f"{exc.status} {exc.message}", status_code=exc.status)


def _call(app: DirectRoutes, method: str, path: str, **scope: Any) -> tuple[int, bytes]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    what = scope.pop("what", None)
    headers = [(b"x-what", what.encode())] if what else []
    full = {"type": "http", "method": method, "path": path, "headers": headers, **scope}
    asyncio.run(app(full, receive, send))
    return sent[0]["status"], sent[1]["body"]


def test_a_post_to_a_table_path_is_answered_by_its_handler_and_the_rest_by_the_router() -> None:
    inner = Inner()
    app = DirectRoutes(inner, handlers={"/embed": _handler}, on_error=_on_error)
    assert _call(app, "POST", "/embed") == (200, b"direct")
    assert _call(app, "POST", "/embed", what="bad") == (400, b"400 a bad request")
    with pytest.raises(RuntimeError, match="a bug"):  # to the request context, as before
        _call(app, "POST", "/embed", what="bug")
    assert inner.reached == []
    assert _call(app, "GET", "/embed") == (200, b"router")
    assert _call(app, "POST", "/other") == (200, b"router")
    assert _call(app, "POST", "/api/embed", root_path="/api") == (200, b"router")
    assert inner.reached == [
        ("GET", "/embed", ""),
        ("POST", "/other", ""),
        ("POST", "/api/embed", "/api"),
    ]


def _without_ids(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: v for k, v in answer.items() if k not in ("id", "request_id")}
    return answer


def _near(answer: Any) -> Any:
    """`answer` with each float matched within 1e-6: two engines in one process each choose
    their small batches' thread count by their own start-up timings, and a sum over other
    threads rounds its last bits otherwise."""
    if isinstance(answer, float):
        return pytest.approx(answer, rel=0, abs=1e-6)
    if isinstance(answer, list):
        return [_near(v) for v in answer]
    if isinstance(answer, dict):
        return {k: _near(v) for k, v in answer.items()}
    return answer


def test_the_direct_way_answers_what_the_router_answers(
    embedded_client: TestClient, embedded_model: Path
) -> None:
    """Side by side: the app, and the same app with the direct routes taken out."""
    app = create_app(Settings(model_id=str(embedded_model)))
    app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectRoutes]
    asks: list[tuple[str, Any]] = [
        ("/", {"inputs": "Paris is the capital of France."}),
        ("/embed", {"inputs": ["a", "b c"], "dimensions": 3}),
        ("/v1/embeddings", {"input": "hello", "model": "m"}),
        ("/v1/embeddings", {"input": []}),  # 422, OpenAI's envelope
        ("/rerank", {"query": "q", "texts": ["t"]}),  # 424: an embedding model
        ("/embed", {"inputs": "x", "truncate": "yes"}),  # 422
    ]
    skip = {"x-request-id", "content-length"}
    statuses = set()
    with TestClient(app, raise_server_exceptions=False) as routed:
        wait_ready(routed.get)
        for path, body in asks:
            direct, through = embedded_client.post(path, json=body), routed.post(path, json=body)
            assert direct.status_code == through.status_code, (path, direct.text, through.text)
            assert _without_ids(through.json()) == _near(_without_ids(direct.json())), path
            assert {k: v for k, v in direct.headers.items() if k not in skip} == {
                k: v for k, v in through.headers.items() if k not in skip
            }, path
            statuses.add(direct.status_code)
    assert statuses == {200, 422, 424}
