"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for timing the server alone.

Each request is built once as bytes (:func:`wire`), so sending costs the client one write and
reading the answer one head parse plus one read of ``Content-Length`` bytes, whatever the
method or body. A general client costs more per request, and more for a POST with a JSON body
than for a GET, and that difference would be read as the server's (the burst study: see
``loadtest.experiments.burst``). Not a general client: no chunked answers, no redirects, no TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from urllib.parse import urlsplit

from loadtest.client import Request, Result, arrivals

_MAX_HEAD = 64 * 1024


def wire(req: Request, base: str) -> bytes:
    """``req`` as the bytes of one HTTP/1.1 request to ``base`` (keep-alive)."""
    host = urlsplit(base).netloc
    lines = [f"{req.method} {req.path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in req.headers]
    if req.body or req.method == "POST":
        lines.append(f"Content-Length: {len(req.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body


class Connection:
    """One keep-alive connection; :meth:`send` one request at a time."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def send(self, request: bytes, timeout_s: float = 60.0) -> tuple[int, dict[str, str]]:
        """Send ``request`` (from :func:`wire`) and read the whole answer: (status, headers
        with lower-case names). Status 0 when the connection failed or closed (it is opened
        again for the next request)."""
        try:
            if self._writer is None:
                await self.open()
            assert self._reader is not None and self._writer is not None
            self._writer.write(request)
            return await asyncio.wait_for(self._answer(self._reader), timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            await self.close()
            return 0, {}

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD:
            raise OSError("answer head too large")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", ""):
            raise OSError("chunked answers are not supported")
        length = int(headers.get("content-length", "0"))
        if length:
            await reader.readexactly(length)
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def open_loop(
    base: str,
    requests: Sequence[Request],
    rate_per_s: float,
    duration_s: float,
    max_in_flight: int = 2000,
) -> Result:
    """``loadtest.client.open_loop`` on :class:`Connection` s: each arrival takes an idle
    keep-alive connection or opens one (at most ``max_in_flight``), each request's bytes built
    once. Same schedule, latency and drops (``loadtest.client.arrivals``); the client's CPU
    per request is what makes the difference on a machine it shares with the server."""
    wires = {req: wire(req, base) for req in set(requests)}
    idle: list[Connection] = []
    opened: list[Connection] = []

    async def send_one(req: Request) -> int:
        if idle:
            conn = idle.pop()
        else:
            conn = Connection(base)
            opened.append(conn)
        try:
            status, _ = await conn.send(wires[req])
        finally:
            idle.append(conn)
        return status

    try:
        return await arrivals(send_one, requests, rate_per_s, duration_s, max_in_flight)
    finally:
        await asyncio.gather(*(conn.close() for conn in opened))
