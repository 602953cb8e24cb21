"""What a request may learn of its connection from the HTTP server, without a task or timer.

`service.http.bounded` puts a `Connection` in each request's scope under
`extensions["service.connection"]`. The runtime uses it to skip the body's read timeout when the
body has already arrived whole, and to hear of a disconnect by a callback instead of a task
parked on `receive()` per request. Without it (another ASGI server, the in-process test
clients) the runtime does both the ASGI way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlette.types import Scope

EXTENSION = "service.connection"


class Connection(Protocol):
    def body_complete(self) -> bool:
        """The request's whole body has arrived: reading it will not wait."""
        ...

    def on_gone(self, callback: Callable[[], None]) -> Callable[[], object]:
        """Call `callback()` once, on the loop, if the connection closes before the request's
        answer is complete (at once if it already has); the function returned stops watching."""
        ...


def connection_of(scope: Scope) -> Connection | None:
    """The request's `Connection`, if its server gives one."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(EXTENSION)
