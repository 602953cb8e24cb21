"""structlog setup: one line of JSON per event (or a console renderer for humans).

gunicorn's and uvicorn's own loggers are routed through the same formatter, so every line a
pod writes parses the same way. Input text and the API key are never logged.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO

import orjson
import structlog
from structlog.typing import Processor

_FOREIGN = ("gunicorn.error", "uvicorn", "uvicorn.error", "transformers", "service")


_fast: logging.StreamHandler[LineWriter] | None = None  # the JSON handler, for `event_line`
# The writer thread, woken by a line, first sleeps this long, then writes every line queued
# meanwhile at once: at most ~200 wake-ups a second, however many lines.
_GATHER_S = 0.005
_LINE_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_APPEND_NEWLINE


class LineWriter:
    """The log handler's stream: lines are written by a thread of its own, all that are
    queued in one write(2), so a line costs its caller (the event loop, the inference thread)
    a queue put instead of a system call to stderr. Woken by a line, the thread gathers for
    `_GATHER_S` before it writes: a thread woken for every line would take the GIL from the
    loop thousands of times a second under load. One queue keeps every line in order; what is
    queued is written at exit, and a forked child (gunicorn's worker) gets a queue and a thread
    of its own."""

    def __init__(self, target: IO[str]) -> None:
        self._target = target
        self._start()
        os.register_at_fork(after_in_child=self._start)
        atexit.register(self.close)

    def _start(self) -> None:
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        self._lines.put(text)
        return len(text)

    def flush(self) -> None:
        """Nothing to do: the writer thread flushes after every write."""

    def close(self) -> None:
        """Write what is queued and stop the thread (at exit)."""
        self._lines.put(None)
        self._thread.join(timeout=2)

    def _run(self) -> None:
        stop = False
        while not stop:
            line = self._lines.get()
            if line is not None:
                time.sleep(_GATHER_S)  # the lines queued meanwhile go in the same write
            parts: list[str] = []
            while line is not None:
                parts.append(line)
                try:
                    line = self._lines.get_nowait()
                except queue.Empty:
                    break
            stop = line is None
            if parts:
                try:
                    self._target.write("".join(parts))
                    self._target.flush()
                except Exception:  # a closed or broken stderr: there is nobody left to tell
                    pass


_writers: dict[int, LineWriter] = {}


def _writer_for(target: IO[str]) -> LineWriter:
    """One writer per target stream and process (logging may be configured several times)."""
    if id(target) not in _writers:
        _writers[id(target)] = LineWriter(target)
    return _writers[id(target)]


def write_queued() -> None:
    """Write every queued line now and stop the writers: before `os._exit`, which skips the
    `atexit` that would (`service.load_failure`)."""
    for writer in list(_writers.values()):
        writer.close()


def event_line(logger: str, event: str, fields: Mapping[str, object]) -> None:
    """One info line, the same JSON object structlog writes (`event`, `level`, `logger`,
    `timestamp` after the fields), rendered in one orjson call instead of structlog's
    processor chain, which costs over ten times as much on the per-request path. Other formats
    and levels go through structlog as usual."""
    handler = _fast
    if handler is None or not logging.getLogger(logger).isEnabledFor(logging.INFO):
        structlog.get_logger(logger).info(event, **fields)
        return
    now = datetime.datetime.now(datetime.UTC)  # orjson writes it as ISO 8601 with a Z
    line = orjson.dumps(
        {**fields, "event": event, "level": "info", "logger": logger, "timestamp": now},
        default=str,
        option=_LINE_OPTIONS,
    )
    handler.stream.write(line.decode())  # one queue put (`LineWriter`): never interleaves


def _dumps(obj: object, **_: object) -> str:
    return orjson.dumps(obj, default=str).decode()


def configure_logging(level: str = "info", fmt: str = "json") -> logging.Handler:
    """Configure structlog and the standard library's root logger; return the handler."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor = (
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
    handler = logging.StreamHandler(_writer_for(sys.stderr))
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
