"""The benchmark's clients (aiohttp, and the raw one of the burst) against a stub server."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from aiohttp import web

from loadtest import client, rawhttp

T = TypeVar("T")


async def _with_stub(delay_s: float, body: Callable[[str], Awaitable[T]]) -> T:
    """Serve a stub on a free loopback port: every third POST / is shed (503), others 200."""
    counter = itertools.count(1)

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay_s)
        if next(counter) % 3 == 0:
            return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "1"})
        return web.Response(body=b"[[0.5]]", content_type="application/json")

    async def livez(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.post("/", infer), web.get("/livez", livez)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        return await body(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def test_closed_loop_counts_answers_inside_its_window() -> None:
    reqs = [client.raw_text("a short sentence"), client.raw_text("another one")]
    result = asyncio.run(
        _with_stub(0.01, lambda base: client.closed_loop(base, reqs, 4, 1.0, warmup_s=0.2))
    )
    summary = result.summary()
    assert result.elapsed_s == 1.0
    assert set(result.statuses()) == {200, 503}
    # 4 clients, ~10 ms per answer: a few hundred answers per second at most.
    assert 50 < summary["requests"] < 450
    assert summary["inputs_per_s"] == summary["requests_per_s"] > 0
    assert 0.2 < summary["shed_rate"] < 0.45


@pytest.mark.parametrize("open_loop", [client.open_loop, rawhttp.open_loop], ids=["aiohttp", "raw"])
def test_open_loop_sends_at_its_rate_and_drops_beyond_max_in_flight(
    open_loop: Callable[..., Awaitable[client.Result]],
) -> None:
    reqs = [client.raw_text("x"), client.raw_text("a second body")]
    steady = asyncio.run(_with_stub(0.005, lambda base: open_loop(base, reqs, 100, 1.0)))
    assert len(steady.answers) == 100 and steady.dropped == 0
    assert steady.statuses() == {200: 67, 503: 33}  # the stub sheds every third
    assert steady.summary(deadline_s=1.0)["goodput_per_s"] > 50
    crowded = asyncio.run(
        _with_stub(0.5, lambda base: open_loop(base, reqs, 100, 0.5, max_in_flight=5))
    )
    assert crowded.dropped > 0 and len(crowded.answers) + crowded.dropped == 50
    assert len(crowded.answers) >= 5 and set(crowded.statuses()) <= {200, 503}


def test_the_raw_client_reads_statuses_headers_and_bodies_on_one_connection() -> None:
    """`loadtest.rawhttp` (the burst's client): the stub's answers in order on one keep-alive
    connection, each 503's Retry-After, and a fresh connection after the server closed one."""
    post = client.raw_text("a short sentence")

    async def body(base: str) -> list[tuple[int, str | None]]:
        conn = rawhttp.Connection(base)
        wire = rawhttp.wire(post, base)
        assert wire.startswith(b"POST / HTTP/1.1\r\nHost: 127.0.0.1:")
        assert wire.endswith(b"Content-Length: 16\r\n\r\na short sentence")
        got = []
        for _ in range(6):
            status, headers = await conn.send(wire)
            got.append((status, headers.get("retry-after")))
        status, headers = await conn.send(rawhttp.wire(client.LIVEZ, base))
        got.append((status, headers.get("content-type")))
        await conn.close()
        status, _ = await conn.send(wire)  # opens a new connection
        got.append((status, None))
        await conn.close()
        return got

    got = asyncio.run(_with_stub(0.0, body))
    assert got[:6] == [(200, None), (200, None), (503, "1")] * 2
    assert got[6] == (200, "application/json; charset=utf-8")
    assert got[7][0] in (200, 503)


def test_the_raw_client_answers_0_when_nobody_listens() -> None:
    import socket

    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    status, headers = asyncio.run(rawhttp.Connection(base).send(rawhttp.wire(client.LIVEZ, base)))
    assert (status, headers) == (0, {})
