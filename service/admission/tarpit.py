"""The tarpit: which requests retry a shed before its Retry-After has passed.

Clients that resend at once after a 503 (a retry storm) would turn every freed CPU cycle into
another shed (Bronson et al., "Metastable Failures in Distributed Systems", HotOS 2021). A retry
is the same request again: the same connection (client address and port), route and body
length (`Content-Length`), since a storm client resends byte for byte what was shed. Any other
request on the connection (another route or body length: behind a proxy that pools its
upstream connections, the next client's) is not a retry.
"""

from __future__ import annotations

import time

from starlette.types import Scope

# Sheds are remembered until their Retry-After passes; the expired ones are dropped at most
# this often, so the map holds about the connections of the last seconds.
_PURGE_EVERY_S = 5.0

Key = tuple[object, str, bytes | None]  # (client (host, port), path, Content-Length)


def request_key(scope: Scope) -> Key:
    """What makes a request a retry of one shed before: its connection, route, body length."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    return scope.get("client"), scope["path"], length


class Tarpit:
    """The Retry-After of each recent shed, by request key (the loop's thread only)."""

    def __init__(self) -> None:
        self._retry_at: dict[Key, float] = {}  # key -> when its Retry-After passes (monotonic)
        self._purge_at = 0.0

    def early_by(self, key: Key) -> float:
        """Seconds until the Retry-After of this request's last shed has passed (0: not early,
        or not shed before)."""
        retry_at = self._retry_at.get(key)
        return 0.0 if retry_at is None else max(0.0, retry_at - time.monotonic())

    def remember(self, key: Key, retry_after_s: float) -> None:
        """A request with this key was shed with `Retry-After: retry_after_s`."""
        if key[0] is None:
            return
        now = time.monotonic()
        if now >= self._purge_at:  # forget the connections whose Retry-After has passed
            self._retry_at = {c: t for c, t in self._retry_at.items() if t > now}
            self._purge_at = now + _PURGE_EVERY_S
        self._retry_at[key] = now + retry_after_s
