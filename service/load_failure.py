"""A model that cannot load ends the server, saying why in its last log line.

Loading runs in the worker's inference thread, after gunicorn has started listening; a worker
that only turned `/livez` to 503 left a pod that never became ready behind a long traceback.
Instead the worker logs one line naming MODEL_ID and what is missing (the traceback before it,
at debug level), records that line, and exits with gunicorn's worker-boot-error status (3): the
master then stops and exits 3 too, and its `on_exit` hook (`service.gunicorn_conf`) logs the
recorded line once more, after gunicorn's own "Shutting down" lines, so that it is the process's
last. What can be checked without loading anything (a folder that does not exist or holds no
config.json, a hub id not cached while offline) is refused earlier, by the console script
(`service.engine.loading.load.preflight`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import structlog

from service import log

_log = structlog.get_logger("service.batcher")

WORKER_BOOT_ERROR = 3  # gunicorn's Arbiter.WORKER_BOOT_ERROR: the master halts with it
_MAX_CHARS = 200  # the line's message; a JSON log line stays under 300 characters
_ERROR_LINE = re.compile(r"^\s*[A-Za-z_.]*(?:Error|Exception): (.+)$")


def describe(model_id: str, exc: BaseException) -> str:
    """One line: MODEL_ID and what the loader found missing. transformers' pipeline wraps the
    errors of each model class it tried, tracebacks included, in one message ("Could not load
    model ... See the original errors"): the first `SomethingError: message` line in it is
    the original error ("Error no file named model.safetensors, or pytorch_model.bin, found
    in directory ..."); else the message's first line."""
    text = str(exc).strip()
    original = next((m.group(1) for m in map(_ERROR_LINE.match, text.splitlines()) if m), None)
    what = original or (text.splitlines()[0].strip() if text else type(exc).__name__)
    what = what.removeprefix("Error ").strip()
    line = f"MODEL_ID={model_id} could not be loaded: {what}"
    return line if len(line) <= _MAX_CHARS else line[: _MAX_CHARS - 3] + "..."


def report(model_id: str | None, exc: BaseException) -> str:
    """Log the failure: the traceback at debug level, then the line (`describe`); return it."""
    line = describe(model_id or "the embedded all-MiniLM-L6-v2", exc)
    _log.debug("model_load_traceback", exc_info=exc)
    _log.error("model_load_failed", reason=line)
    return line


def record_and_exit(line: str, path: str | None) -> None:
    """Under gunicorn (`path`: the settings' `load_failure_file`): record `line` there for the
    master and end the worker (status 3) at once; no return. Elsewhere (None): return, leaving
    the caller's failed state in place."""
    if not path:
        return
    Path(path).write_text(line, encoding="utf-8")
    log.write_queued()  # the log lines before this one, still queued
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(WORKER_BOOT_ERROR)


def recorded(path: str | None) -> str | None:
    """The line a worker recorded at `path`, if any."""
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
