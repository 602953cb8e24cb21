"""The gunicorn worker class: uvicorn's worker (uvloop) with the service's HTTP edge.

uvicorn's httptools protocol enforces no bound on the request head and no deadline on it, and
gunicorn's `limit_request_*` settings do not reach uvicorn workers: one client sending a 200 MB
header kept the event loop parsing until gunicorn killed the worker for missing its heartbeat.
`service.http.edge.EdgeProtocol` keeps httptools (half h11's CPU per request), adds the bounds
(MAX_REQUEST_HEAD_BYTES, REQUEST_HEAD_TIMEOUT_S, MAX_CONNECTIONS), and is bound to the app's
admission policy once gunicorn has loaded the app (`Worker.load_wsgi`).

A clean stop (SIGTERM, or Ctrl+C) logs nothing alarming: see `Worker.run` and
`Worker.init_signals` for the two lines it used to print.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """Exit with status 0 (SystemExit unwinds the event loop and gunicorn's worker code)."""
    sys.exit(0)


class Worker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no type hints
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": "service.http.edge:EdgeProtocol",
    }
    sockets: list[Any]  # gunicorn's listeners (set by its Worker.__init__)

    def load_wsgi(self) -> None:
        """gunicorn's load of the app (`wsgi_app`), then the edge bound to the app's admission
        policy: the edge decides each request's head with the object the app's gate and error
        table report to."""
        # Imported here, in the worker: gunicorn's arbiter imports this module and has no use
        # for the service's modules.
        from service.app import Service
        from service.http.edge import EdgeProtocol

        super().load_wsgi()
        if isinstance(self.wsgi, Service):
            self.config.http = EdgeProtocol.bound(self.wsgi.admission)

    def init_signals(self) -> None:
        """uvicorn's `Server` handles SIGTERM and SIGINT while it serves, and once it has
        stopped it raises the signal again for the handler it found: gunicorn's default one
        here (uvicorn-worker resets them), so the drained worker died of the signal and the
        arbiter logged `Worker (pid:N) was sent SIGTERM!` after every clean stop. With this
        handler the re-raised signal ends the worker with status 0; a signal that arrives
        before the server runs (while the app is imported) also ends it, as before."""
        super().init_signals()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _exit_cleanly)

    def run(self) -> None:
        """Serve on the listening `socket.socket` objects rather than gunicorn's wrappers of
        them. When uvloop closes a server it closes the descriptor itself, then detaches a
        `socket.socket` (nothing left to close) but calls `close()` on any other object: on
        gunicorn's wrapper that close failed with EBADF, logged as `Error while closing socket
        [Errno 9] Bad file descriptor` at every stop (uvloop's `UVSocketHandle._close`)."""
        self.sockets = [getattr(listener, "sock", listener) for listener in self.sockets]
        super().run()
