"""gunicorn settings for the `pipeline-server` console script (`gunicorn -c` this file).

One worker: one model per process (and per pod). The drain time after SIGTERM and gunicorn's
graceful timeout agree: gunicorn waits DRAIN_TIMEOUT_S plus a margin before it kills the
worker, so the app answers everything it accepted first (docs/operations.md, Shutdown and drain).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

from gunicorn.glogging import Logger

from service import load_failure
from service.log import configure_logging
from service.settings import hand_down, process_settings

_settings = process_settings()
_DRAIN_MARGIN_S = 5

bind = [
    f"[{_settings.host}]:{_settings.port}"
    if ":" in _settings.host
    else f"{_settings.host}:{_settings.port}"
]
workers = 1
worker_class = "service.worker.Worker"  # uvicorn with the HTTP edge (service/http/edge.py)
# The event loop never blocks on the model (it loads and runs in the inference thread), so
# gunicorn's default heartbeat timeout holds even for loads far longer than it.
timeout = 30
graceful_timeout = int(_settings.drain_timeout_s) + _DRAIN_MARGIN_S
keepalive = 75  # above common load balancers' idle timeouts (60 s), so they close first
accesslog = None
# No control socket: nothing uses it, and it wants a writable home (read-only in the chart).
control_socket_disable = True
wsgi_app = "service.app:create_app()"


class JsonLogger(Logger):  # type: ignore[misc]  # gunicorn ships no types
    """gunicorn's own lines through the service's structlog formatter."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        handler = configure_logging(_settings.log_level, _settings.log_format)
        for logger in (self.error_log, self.access_log):
            logger.handlers = [handler]
            logger.propagate = False


logger_class = JsonLogger


def on_starting(server: Any) -> None:
    """In the master, before any worker: where a worker whose model cannot load records why
    (`service.load_failure`), handed down in the settings the forked worker inherits."""
    fd, path = tempfile.mkstemp(prefix="pipeline-server-load-")
    os.close(fd)
    hand_down(load_failure_file=path)


def on_exit(server: Any) -> None:
    """gunicorn's last hook: a model that could not load is said again, as the last line."""
    path = process_settings().load_failure_file
    line = load_failure.recorded(path)
    if line is not None:
        server.log.error(line)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
