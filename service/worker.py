"""The gunicorn worker class: uvicorn's worker (uvloop) with the service's HTTP edge.

uvicorn's httptools protocol enforces no bound on the request head and no deadline on it, and
gunicorn's `limit_request_*` settings do not reach uvicorn workers: one client sending a 200 MB
header kept the event loop parsing until gunicorn killed the worker for missing its heartbeat.
`service.edge.EdgeProtocol` keeps httptools (half h11's CPU per request: README, "HTTP edge
cost") and adds the limits (MAX_REQUEST_HEAD_BYTES, REQUEST_HEAD_TIMEOUT_S, MAX_CONNECTIONS;
issue 14).
"""

from __future__ import annotations

from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no type hints
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": "service.edge:EdgeProtocol",
    }
