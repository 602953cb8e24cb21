"""Direct routes: the model routes' POSTs go from the admission gate to their handler.

Starlette's router finds a route by trying each route's pattern in turn, then wraps the handler
in its exception layer and a second request wrapper; that is the same work for every request,
and on the answered one-input request it is a measurable share of the event loop's CPU. A
`POST` to a path in the table here skips it: its handler runs at once, a `ServiceError` it
raises is answered by the app's own handler for it (the same status, headers, body and log
line), anything else propagates to the request context, as through the router. Every other
method and path (a `GET` on a model route: 405; an unknown path: 404), and any request under a
`root_path` (the router strips it), goes to the router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError

Handler = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


def post_handlers(routes: Iterable[object]) -> dict[str, Handler]:
    """{path: handler} of the routes that answer `POST` alone (the model routes)."""
    return {
        route.path: route.endpoint
        for route in routes
        if isinstance(route, Route) and route.methods == {"POST"}
    }


class DirectRoutes:
    """Pure ASGI middleware in front of the router: `handlers` ({path: handler}, from
    `post_handlers`) answer their `POST`s; `on_error` answers a `ServiceError` they raise."""

    def __init__(self, app: ASGIApp, *, handlers: dict[str, Handler], on_error: ErrorHandler):
        self.app = app
        self.handlers = handlers
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except ServiceError as exc:
            response = await self.on_error(request, exc)
        await response(scope, receive, send)
