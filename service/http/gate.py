"""The admission policy's gate in the app: a pure ASGI middleware in front of the router.

For what the edge left to the app (a request through a proxy, a pipelined one, an early retry,
any request when the server runs without `service.http.edge`) it asks the policy
(`AdmissionPolicy.admit_head`) from the head alone, before the body is read or any route runs,
and answers a shed with the same status, headers, body, metrics and log line as the edge.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.admission.policy import AdmissionPolicy
from service.http import context


class AdmissionGate:
    """Sheds from the head what `policy` refuses; lets everything else through."""

    def __init__(self, app: ASGIApp, *, policy: AdmissionPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = await self.policy.admit_head(scope)
        if error is None:
            await self.app(scope, receive, send)
            return
        request_id = scope["state"]["request_id"]  # (the request context's)
        context.note_error(error)  # its log line says why
        status, headers, body = self.policy.shed(scope, error, request_id, in_app=True)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
