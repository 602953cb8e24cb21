"""structlog setup: one line of JSON per event (or a console renderer for humans).

gunicorn's and uvicorn's own loggers are routed through the same formatter, so every line a
pod writes parses the same way. Input text and the API key are never logged.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

import orjson
import structlog

_FOREIGN = ("gunicorn.error", "uvicorn", "uvicorn.error", "transformers", "service")


_fast: logging.StreamHandler[Any] | None = None  # the JSON handler, for `event_line`


def event_line(logger: str, event: str, fields: dict[str, Any]) -> None:
    """One info line, the same JSON object structlog writes (`event`, `level`, `logger`,
    `timestamp` after the fields), rendered in one orjson call instead of structlog's
    processor chain: ~4 us instead of ~36 us, on the per-request path (issue 13). Other
    formats and levels go through structlog as usual."""
    handler = _fast
    if handler is None or not logging.getLogger(logger).isEnabledFor(logging.INFO):
        structlog.get_logger(logger).info(event, **fields)
        return
    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    line = orjson.dumps(
        {**fields, "event": event, "level": "info", "logger": logger, "timestamp": now},
        default=str,
    )
    handler.acquire()  # the handler's own lock: lines from other threads never interleave
    try:
        handler.stream.write(line.decode() + "\n")
        handler.flush()
    finally:
        handler.release()


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def configure_logging(level: str = "info", fmt: str = "json") -> logging.Handler:
    """Configure structlog and the standard library's root logger; return the handler."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if fmt == "console"
        else structlog.processors.JSONRenderer(serializer=_dumps)
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.processors.format_exc_info],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    global _fast
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    _fast = handler if fmt == "json" else None
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in _FOREIGN:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
    # Our middleware writes one line per request (with the request id): no second access line.
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("gunicorn.access").disabled = True
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return handler
