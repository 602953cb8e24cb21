"""The gunicorn worker class: uvicorn's worker with the h11 HTTP parser, which bounds the
request head (line and headers) at 64 KiB.

uvicorn's default parser on Linux, httptools, enforces no header size limit, and gunicorn's
`limit_request_*` settings do not reach uvicorn workers: one client sending a 200 MB header
kept the event loop parsing until gunicorn killed the worker for missing its heartbeat. h11
refuses an oversize head with 400 and closes the connection. (uvloop stays on: `loop=auto`.)
"""

from __future__ import annotations

from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker

MAX_REQUEST_HEAD_BYTES = 64 * 1024


class Worker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no type hints
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": "h11",
        "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
    }
