"""A burst of 160 requests at once against a busy server: how fast are sheds and /livez?

``python -m loadtest.experiments.bench --only burst`` (about 1.5 minutes). The server runs the
default model with ``MAX_QUEUE_SIZE=8`` (and ``MAX_CLIENT_BATCH_SIZE=8``, which must not exceed it).
Every request goes on its own keep-alive connection, opened beforehand: 168 connections
(``loadtest.rawhttp``: each request's bytes built once, so a POST costs the client what a GET
does; ``--burst-client aiohttp`` for the general client, which costs more per request and more
for a POST). ``--burst-count`` rounds (default 10), each of:

1. the client's floor: 160 ``GET /livez`` at once against the idle server;
2. a background closed loop (wrk, 4 connections, mixed-length inputs, waiting 50 ms after a
   503 so that it does not spin while the burst holds the queue) keeps the model busy for 4 s;
   2 s in, 160 ``POST /`` (a short JSON input) at once, with 8 ``GET /livez`` among them;
   nearly all POSTs are shed (503);
3. the next round starts once the longest Retry-After of this burst has passed (at least
   1 s) and the model is idle again: bursts of polite requests, which the server's tarpit
   answers at once (early retries are the storm workload's).

Each floor is measured seconds before its burst, so the machine's drift weighs on both alike.
Latency is from the burst's launch to each answer read, in milliseconds, so the floor and the
burst are timed the same way; the client's garbage collector is off during each burst (see
:func:`burst`). Targets: shed p95 within 10 ms of the floor's p95; /livez during the burst
p95 within 20 ms of it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from loadtest import client, corpus, rawhttp, servers, wrk
from loadtest.stats import latency_summary
from loadtest.workloads import common

NAME = "burst"
SIZE = 160
PROBES = 8
SHED_TARGET_MS, LIVEZ_TARGET_MS = 10.0, 20.0
# Per round: the background loop runs this long (whole seconds: wrk's unit), its queue is full
# after _FILL_S, and after it stops the server's last batch ends within _SETTLE_S.
_BUSY_S, _FILL_S, _SETTLE_S = 4.0, 2.0, 1.0


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--burst-count", type=int, help="bursts (default 10, quick 4)")
    p.add_argument("--burst-size", type=int, default=SIZE, help="requests per burst")
    p.add_argument(
        "--burst-client",
        choices=sorted(SENDERS),
        default="raw",
        help="raw: pre-built requests on asyncio streams (default); aiohttp: the general client",
    )


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.burst_count = args.burst_count or (4 if args.quick else 10)


class Sender(Protocol):
    """One client connection: send a request, read the whole answer, return (status, its
    Retry-After in seconds or None); status 0 on a connection error."""

    async def __call__(self, req: client.Request) -> tuple[int, float | None]: ...


def raw_sender(base: str) -> tuple[Sender, Callable[[], Awaitable[None]]]:
    """A :class:`loadtest.rawhttp.Connection`: each request's bytes built once."""
    conn = rawhttp.Connection(base)
    wires: dict[client.Request, bytes] = {}

    async def send(req: client.Request) -> tuple[int, float | None]:
        if req not in wires:
            wires[req] = rawhttp.wire(req, base)
        status, headers = await conn.send(wires[req])
        return status, _seconds(headers.get("retry-after", ""))

    return send, conn.close


def aiohttp_sender(base: str) -> tuple[Sender, Callable[[], Awaitable[None]]]:
    """An aiohttp session with one connection (the general client, for comparison)."""
    http = client.session(1)

    async def send(req: client.Request) -> tuple[int, float | None]:
        try:
            async with http.request(
                req.method, base + req.path, data=req.body or None, headers=dict(req.headers)
            ) as resp:
                await resp.read()
                return resp.status, _seconds(resp.headers.get("Retry-After", ""))
        except (TimeoutError, aiohttp.ClientError):
            return 0, None

    return send, http.close


SENDERS = {"raw": raw_sender, "aiohttp": aiohttp_sender}


def _seconds(value: str) -> float | None:
    return float(value) if value.isdigit() else None


async def burst(
    requests: Sequence[client.Request], senders: Sequence[Sender]
) -> list[tuple[str, int, float]]:
    """Send ``requests[i]`` with ``senders[i]``, all at once; (path, status, ms from launch).

    The client's own garbage collector is off during the burst: this process holds a
    tokenizer (the corpus), and a full collection can pause the client for a large part of a
    burst, which would be read as the server's latency. :func:`measure` also freezes what was
    allocated before it starts."""
    gc.disable()
    try:
        return await _burst(requests, senders)
    finally:
        gc.enable()


async def _burst(
    requests: Sequence[client.Request], senders: Sequence[Sender]
) -> list[tuple[str, int, float]]:
    launched = time.perf_counter()
    _retry_after.clear()

    async def one(send: Sender, req: client.Request) -> tuple[str, int, float]:
        status, retry_after = await send(req)
        if status == 503 and retry_after is not None:
            _retry_after.append(retry_after)
        return req.path, status, (time.perf_counter() - launched) * 1000

    return await asyncio.gather(*(one(c, r) for c, r in zip(senders, requests, strict=True)))


_retry_after: list[float] = []  # the Retry-After values of the last burst's 503s


async def measure(
    base: str, args: argparse.Namespace, busy: Callable[[float], threading.Thread]
) -> dict[str, Any]:
    """Rounds of: a floor burst on the idle server, then ``busy(seconds)`` (the background
    loop, started in a thread) and a burst on the busy server once its queue is full. Each
    floor is measured seconds before its burst, so a drift of the machine's speed (tens of
    percent within minutes here) weighs on both alike."""
    size = args.burst_size
    post = client.Request(
        "POST", "/", common.json_body(corpus.short_inputs(1)[0]), (("Content-Type", common.JSON),)
    )
    gc.collect()
    gc.freeze()  # the corpus's tokenizer and the imports: out of the collector's reach
    made = [SENDERS[args.burst_client](base) for _ in range(size + PROBES)]
    sessions = [send for send, _ in made]
    every = size // PROBES
    mixed = [client.LIVEZ if (i + 1) % (every + 1) == 0 else post for i in range(len(sessions))]
    floor: list[float] = []
    answers: list[tuple[str, int, float]] = []
    per_burst: list[dict[str, Any]] = []
    try:
        await burst([client.LIVEZ] * len(sessions), sessions)  # open every connection
        for _ in range(args.burst_count):
            await asyncio.sleep(0.2)
            floor_ms = [ms for _, _, ms in await burst([client.LIVEZ] * size, sessions[:size])]
            floor += floor_ms
            loader = busy(_BUSY_S)
            await asyncio.sleep(_FILL_S)  # the background loop is up and the queue is full
            got = await burst(mixed, sessions)
            answers += got
            shed_ms = sorted(ms for path, status, ms in got if path == "/" and status == 503)
            # The next burst comes once the Retry-After it was told has passed: each burst is
            # a burst of polite requests (the server holds early retries on a connection, and
            # clients that ignore Retry-After are the storm workload's).
            wait = max([1.0, *_retry_after])
            per_burst.append(
                {
                    "floor_p95_ms": round(
                        latency_summary([x / 1000 for x in floor_ms])["p95_ms"], 1
                    ),
                    "shed_ms": [round(x, 1) for x in shed_ms],
                    "next_after_s": wait,
                }
            )
            started = time.monotonic()
            await asyncio.to_thread(loader.join, _BUSY_S + 60)
            # The background loop has stopped; its last batch ends within a second.
            await asyncio.sleep(max(wait - (time.monotonic() - started), 0.0) + _SETTLE_S)
    finally:
        await asyncio.gather(*(close() for _, close in made))
    shed = [ms for path, status, ms in answers if path == "/" and status == 503]
    livez = [ms for path, status, ms in answers if path == "/livez"]
    statuses: dict[int, int] = {}
    for path, status, _ in answers:
        if path == "/":
            statuses[status] = statuses.get(status, 0) + 1
    return {
        "floor": latency_summary([x / 1000 for x in floor]),
        "shed": latency_summary([x / 1000 for x in shed]),
        "livez": latency_summary([x / 1000 for x in livez]),
        "post_statuses": statuses,
        "per_burst": per_burst,
        "size": size,
        "count": args.burst_count,
        "floor_n": len(floor),
        "shed_n": len(shed),
        "livez_n": len(livez),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    env = common.server_env(args, MAX_QUEUE_SIZE="8", MAX_CLIENT_BATCH_SIZE="8")
    # Long passages past the model's limit are cut (`truncate`), as a real client would ask.
    background = [common.json_body(t, truncate=True) for t in corpus.mixed_inputs(128)]
    result: dict[str, Any] = {"env": env, "client": args.burst_client}
    runs: list[dict[str, Any]] = []
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:

        def busy(seconds: float) -> threading.Thread:
            def load() -> None:
                runs.append(
                    wrk.run(srv.base + "/", background, 4, seconds, backoff_ms=50).summary()
                )

            loader = threading.Thread(target=load, name="background-load", daemon=True)
            loader.start()
            return loader

        result.update(client.run(measure(srv.base, args, busy)))
    result["background"] = {
        "ok_per_s": statistics.fmean(r["ok_per_s"] for r in runs) if runs else float("nan"),
        "statuses": {
            str(k): sum(int(r["statuses"].get(k, 0)) for r in runs)
            for k in sorted({k for r in runs for k in r["statuses"]})
        },
    }
    f, s, lz = result["floor"], result["shed"], result["livez"]
    result["shed_p95_over_floor_ms"] = s["p95_ms"] - f["p95_ms"]
    result["livez_p95_over_floor_ms"] = lz["p95_ms"] - f["p95_ms"]
    return result


def table(result: dict[str, Any]) -> str:
    f, s, lz = result["floor"], result["shed"], result["livez"]
    bg = result.get("background", {})
    return "\n".join(
        [
            f"Burst: {result['count']} bursts of {result['size']} requests at once (and as many "
            f"floor bursts; client: {result.get('client', 'aiohttp')}); "
            f"MAX_QUEUE_SIZE=8; background wrk 4 connections (mixed inputs) "
            f"{bg.get('ok_per_s', float('nan')):.1f} answers/s, statuses "
            f"{bg.get('statuses', {})}. Latency from launch to answer, ms:",
            "",
            "| what | n | p50 ms | p95 ms | p99 ms | p95 - floor p95 | target |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| floor: GET /livez x {result['size']}, idle | {result['floor_n']} | "
            f"{common.ms(f['p50_ms'])} | {common.ms(f['p95_ms'])} | {common.ms(f['p99_ms'])} | "
            "| |",
            f"| sheds (503) in the burst | {result['shed_n']} | {common.ms(s['p50_ms'])} | "
            f"{common.ms(s['p95_ms'])} | {common.ms(s['p99_ms'])} | "
            f"{common.ms(result['shed_p95_over_floor_ms'])} | <= {SHED_TARGET_MS:g} |",
            f"| /livez in the burst | {result['livez_n']} | {common.ms(lz['p50_ms'])} | "
            f"{common.ms(lz['p95_ms'])} | {common.ms(lz['p99_ms'])} | "
            f"{common.ms(result['livez_p95_over_floor_ms'])} | <= {LIVEZ_TARGET_MS:g} |",
            "",
            f"POST statuses in the bursts: {result['post_statuses']}",
        ]
    )
