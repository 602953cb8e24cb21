"""Concurrent load against a server with aiohttp, and /metrics scrapes for the real-server tests.

aiohttp, not httpx: httpx's async pool stalls at a few hundred concurrent requests (DESIGN.md,
Load tests). Each outcome records the time from the request being on the wire (aiohttp's
`on_request_headers_sent`, so after the client's own connect and queueing) to its answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Outcome:
    """One request's end: `status` (0 when the transport failed: `error` names it)."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    error: str | None = None
    sent_at: float | None = None  # monotonic, when the request line and headers were written
    answered_at: float = 0.0  # monotonic, when the whole answer was read
    request_id: str = ""

    @property
    def seconds(self) -> float:
        """Seconds from the request being on the wire to the answer being read."""
        return self.answered_at - (self.sent_at if self.sent_at is not None else 0.0)


def _trace() -> aiohttp.TraceConfig:
    async def sent(_: Any, ctx: SimpleNamespace, __: Any) -> None:
        ctx.trace_request_ctx.sent_at = time.monotonic()

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(sent)
    return config


def session(timeout_s: float = 60) -> aiohttp.ClientSession:
    """A session with no connection limit (every request its own connection when needed)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        trace_configs=[_trace()],
    )


async def post(
    client: aiohttp.ClientSession, url: str, *, request_id: str = "", **kw: Any
) -> Outcome:
    """POST and read the whole answer; transport errors are recorded, never raised."""
    outcome = Outcome(request_id=request_id)
    headers = dict(kw.pop("headers", {}))
    if request_id:
        headers["X-Request-ID"] = request_id
    try:
        async with client.post(url, headers=headers, trace_request_ctx=outcome, **kw) as response:
            raw = await response.read()
            outcome.status = response.status
            outcome.headers = {k.lower(): v for k, v in response.headers.items()}
            outcome.body = await response.json() if raw else None
    except (TimeoutError, aiohttp.ClientError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.answered_at = time.monotonic()
    return outcome


async def get(client: aiohttp.ClientSession, url: str) -> Outcome:
    outcome = Outcome()
    try:
        async with client.get(url, trace_request_ctx=outcome) as response:
            await response.read()
            outcome.status = response.status
            outcome.headers = {k.lower(): v for k, v in response.headers.items()}
    except (TimeoutError, aiohttp.ClientError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.answered_at = time.monotonic()
    return outcome


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of GET /metrics, keyed by (name, sorted labels)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every label set that contains `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))
