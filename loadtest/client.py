"""The benchmark's load client: aiohttp, closed loop (N clients) or open loop (fixed rate).

aiohttp rather than httpx, whose pool is far slower with many concurrent keep-alive requests.
Bodies are read but never parsed; the client's floor is measured the same way against /livez.
Every loop is bounded in time and in request count. Latencies are seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from loadtest.outcomes import retry_delay
from loadtest.stats import latency_summary

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send: method, path, body, headers, and how many inputs it carries."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    inputs: int = 1


def raw_text(text: str) -> Request:
    """POST / with ``text`` as the raw body (the seed's curl form, text/plain)."""
    return Request("POST", "/", text.encode(), (("Content-Type", "text/plain; charset=utf-8"),))


LIVEZ = Request("GET", "/livez", inputs=0)


@dataclass(slots=True)
class Result:
    """Answers of one run: (status, latency s, inputs) each; status 0 is a connection error."""

    elapsed_s: float = 0.0
    answers: list[tuple[int, float, int]] = field(default_factory=list)
    dropped: int = 0  # open loop: arrivals not sent because max_in_flight was reached

    def statuses(self) -> dict[int, int]:
        """Answer count per HTTP status."""
        return dict(Counter(status for status, _, _ in self.answers))

    def summary(self, deadline_s: float | None = None) -> dict[str, float | int | dict[int, int]]:
        """Throughput of 200 answers (inputs/s and requests/s), their latency, shed latency.

        With ``deadline_s``, ``goodput_per_s`` counts only 200s answered within the deadline.
        """
        ok = [lat for status, lat, _ in self.answers if status == 200]
        good = [lat for lat in ok if deadline_s is None or lat <= deadline_s]
        secs = self.elapsed_s or float("nan")
        shed = latency_summary([lat for status, lat, _ in self.answers if status == 503])
        return {
            "requests": len(self.answers),
            "inputs_per_s": sum(n for status, _, n in self.answers if status == 200) / secs,
            "requests_per_s": len(ok) / secs,
            "goodput_per_s": len(good) / secs,
            **latency_summary(ok),
            "shed_rate": sum(s == 503 for s, _, _ in self.answers) / max(1, len(self.answers)),
            "shed_p50_ms": shed["p50_ms"],
            "shed_p99_ms": shed["p99_ms"],
            "statuses": self.statuses(),
            "dropped": self.dropped,
        }


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop where it is installed (uvicorn[standard] brings it): the client
    shares the cores with the server under test, and uvloop costs it less CPU."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def session(limit: int) -> aiohttp.ClientSession:
    """A session with at most ``limit`` connections, keep-alive, and a 60 s total timeout."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=60)
    )


async def send(http: aiohttp.ClientSession, base: str, req: Request) -> int:
    """Send ``req`` and read the whole body; returns the status (0 on a connection error)."""
    try:
        async with http.request(
            req.method, base + req.path, data=req.body or None, headers=dict(req.headers)
        ) as resp:
            await resp.read()
            return resp.status
    except (TimeoutError, aiohttp.ClientError):
        return 0


async def closed_loop(
    base: str,
    requests: Sequence[Request],
    clients: int,
    duration_s: float,
    warmup_s: float = 1.0,
    max_requests: int = 200_000,
) -> Result:
    """``clients`` loops each sending its next request when the last is answered.

    Client ``i`` sends requests ``i, i + clients, ...`` (cycling), so all clients together walk
    the list in order. Only answers completed inside the window ``[warmup_s, warmup_s +
    duration_s]`` are recorded; requests still in flight at its end are awaited (so the next
    measurement starts on an idle server) but not counted.
    """
    result = Result(elapsed_s=duration_s)
    start = time.perf_counter()
    record_from, stop_at = start + warmup_s, start + warmup_s + duration_s
    budget = [max_requests]

    async def one_client(http: aiohttp.ClientSession, index: int) -> None:
        k = index
        while time.perf_counter() < stop_at and budget[0] > 0:
            budget[0] -= 1
            req = requests[k % len(requests)]
            k += clients
            sent = time.perf_counter()
            status = await send(http, base, req)
            done = time.perf_counter()
            if record_from <= done <= stop_at:
                result.answers.append((status, done - sent, req.inputs))

    async with session(clients) as http:
        await asyncio.gather(*(one_client(http, i) for i in range(clients)))
    if budget[0] <= 0:  # stopped by the count bound: the window ended early
        result.elapsed_s = max(1e-9, time.perf_counter() - record_from)
    return result


async def open_loop(
    base: str,
    requests: Sequence[Request],
    rate_per_s: float,
    duration_s: float,
    max_in_flight: int = 2000,
) -> Result:
    """Send at a fixed arrival rate for ``duration_s``, whatever the answers do (aiohttp, at
    most ``max_in_flight`` keep-alive connections; :func:`arrivals` for the schedule, the
    latency and what is dropped). ``loadtest.rawhttp.open_loop`` is the cheaper client."""
    async with session(max_in_flight) as http:
        return await arrivals(
            lambda req: send(http, base, req), requests, rate_per_s, duration_s, max_in_flight
        )


async def arrivals(
    send_one: Callable[[Request], Awaitable[int]],
    requests: Sequence[Request],
    rate_per_s: float,
    duration_s: float,
    max_in_flight: int,
) -> Result:
    """Open-loop arrivals: ``requests`` in turn, one each ``1 / rate_per_s`` seconds for
    ``duration_s``, each sent by ``send_one`` (which returns the status, 0 on a connection
    error) without waiting for the answers before it.

    Latency counts from each request's scheduled send time, so a slow client or server cannot
    hide queueing (no coordinated omission). Arrivals beyond ``max_in_flight`` are counted as
    ``dropped``, not sent. ``elapsed_s`` is the arrival window (``duration_s``).
    """
    result = Result(elapsed_s=duration_s)
    total = int(rate_per_s * duration_s)

    async def one(req: Request, scheduled: float) -> None:
        status = await send_one(req)
        result.answers.append((status, time.perf_counter() - scheduled, req.inputs))

    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    for k in range(total):
        scheduled = start + k / rate_per_s
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        if len(tasks) >= max_in_flight:
            result.dropped += 1
            continue
        task = asyncio.create_task(one(requests[k % len(requests)], scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return result


async def polite(
    url: str,
    body: bytes,
    stop: asyncio.Event,
    out: list[tuple[int, float]],
    *,
    cap_s: float = 5.0,
    fresh_connections: bool = False,
    timeout_s: float = 30.0,
    max_answers: int = 100_000,
) -> None:
    """One polite client: POST ``body`` (JSON) to ``url`` again and again until ``stop`` (or
    ``max_answers``); after a 503, wait what Retry-After says (at most ``cap_s``), as the
    openai SDK does. ``fresh_connections``: a new connection per request. Appends (status,
    seconds) per answer to ``out``; status 0 is a connection error."""
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=fresh_connections),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as http:
        while not stop.is_set() and len(out) < max_answers:
            sent = time.perf_counter()
            retry_after = None
            try:
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    status, retry_after = resp.status, resp.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            out.append((status, time.perf_counter() - sent))
            if status == 503:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry_delay(retry_after, cap_s))
