"""A burst of 160 requests at once against a busy server: how fast are sheds and /livez?

``python -m loadtest.bench --only burst`` (about 1 minute). The server runs the default model
with ``MAX_QUEUE_SIZE=8`` (and ``MAX_CLIENT_BATCH_SIZE=8``, which must not exceed it).

1. The client's floor: 160 ``GET /livez`` at once against the idle server, each on its own
   keep-alive connection opened beforehand (aiohttp, one connection each).
2. A background closed loop (wrk, 4 connections, mixed-length inputs, waiting 50 ms after a
   503 so that it does not spin while the burst holds the queue) keeps the model busy; then,
   ``--burst-count`` times, 160 ``POST /`` (a short JSON input) at once, each on its own warm
   connection, with 8 ``GET /livez`` sent among them on their own connections, each burst
   once the longest Retry-After of the one before has passed (at least 1 s): bursts of polite
   requests, which the server's tarpit answers at once (early retries are the storm
   workload's). Nearly all POSTs are shed (503).

Latency is from the burst's launch to each answer read, in milliseconds, so the floor and the
burst are timed the same way; the client's garbage collector is off during each burst (see
:func:`burst`). Targets (issue 13): shed p95 within 10 ms of the floor's p95;
/livez during the burst p95 within 20 ms of it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from loadtest import client, corpus, servers, wrk
from loadtest.stats import latency_summary
from loadtest.workloads import common

NAME = "burst"
SIZE = 160
PROBES = 8
SHED_TARGET_MS, LIVEZ_TARGET_MS = 10.0, 20.0


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--burst-count", type=int, help="bursts (default 10, quick 4)")
    p.add_argument("--burst-size", type=int, default=SIZE, help="requests per burst")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.burst_count = args.burst_count or (4 if args.quick else 10)


async def burst(
    base: str, requests: Sequence[client.Request], connections: list[aiohttp.ClientSession]
) -> list[tuple[str, int, float]]:
    """Send ``requests[i]`` on ``connections[i]``, all at once; (path, status, ms from launch).

    The client's own garbage collector is off during the burst: this process holds a
    tokenizer (the corpus), and a full collection here paused the client for about 200 ms in
    some bursts, the idle floor included (p95 25 to 225 ms run to run), which would be read as
    the server's latency. :func:`measure` also freezes what was allocated before it starts."""
    gc.disable()
    try:
        return await _burst(base, requests, connections)
    finally:
        gc.enable()


async def _burst(
    base: str, requests: Sequence[client.Request], connections: list[aiohttp.ClientSession]
) -> list[tuple[str, int, float]]:
    launched = time.perf_counter()
    _retry_after.clear()

    async def one(http: aiohttp.ClientSession, req: client.Request) -> tuple[str, int, float]:
        status = await _send(http, base, req)
        return req.path, status, (time.perf_counter() - launched) * 1000

    return await asyncio.gather(*(one(h, r) for h, r in zip(connections, requests, strict=True)))


_retry_after: list[float] = []  # the Retry-After values of the last burst's 503s


async def _send(http: aiohttp.ClientSession, base: str, req: client.Request) -> int:
    """:func:`client.send`, keeping each 503's Retry-After (in ``_retry_after``)."""
    try:
        async with http.request(
            req.method, base + req.path, data=req.body or None, headers=dict(req.headers)
        ) as resp:
            await resp.read()
            if resp.status == 503 and resp.headers.get("Retry-After", "").isdigit():
                _retry_after.append(float(resp.headers["Retry-After"]))
            return resp.status
    except (TimeoutError, aiohttp.ClientError):
        return 0


async def measure(
    base: str, args: argparse.Namespace, start_load: threading.Event
) -> dict[str, Any]:
    """The floor on the idle server, then ``start_load`` and the bursts on the busy one."""
    size = args.burst_size
    post = client.Request(
        "POST", "/", common.json_body(corpus.short_inputs(1)[0]), (("Content-Type", common.JSON),)
    )
    gc.collect()
    gc.freeze()  # the corpus's tokenizer and the imports: out of the collector's reach
    sessions = [client.session(1) for _ in range(size + PROBES)]
    try:
        await burst(base, [client.LIVEZ] * len(sessions), sessions)  # open every connection
        floor: list[float] = []
        for _ in range(args.burst_count):
            floor += [ms for _, _, ms in await burst(base, [client.LIVEZ] * size, sessions[:size])]
            await asyncio.sleep(0.2)
        start_load.set()
        await asyncio.sleep(2)  # the background loop is up and the queue is full
        every = size // PROBES
        mixed = [client.LIVEZ if (i + 1) % (every + 1) == 0 else post for i in range(len(sessions))]
        answers: list[tuple[str, int, float]] = []
        per_burst: list[dict[str, Any]] = []
        for _ in range(args.burst_count):
            got = await burst(base, mixed, sessions)
            answers += got
            shed_ms = sorted(ms for path, status, ms in got if path == "/" and status == 503)
            # The next burst comes once the Retry-After it was told has passed: each burst is
            # a burst of polite requests (the server holds early retries on a connection, and
            # clients that ignore Retry-After are the storm workload's).
            wait = max([1.0, *_retry_after])
            per_burst.append({"shed_ms": [round(x, 1) for x in shed_ms], "next_after_s": wait})
            await asyncio.sleep(wait + 0.05)
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
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
    start_load = threading.Event()
    seconds = 4 + 3.5 * args.burst_count  # the background loop outlasts the bursts
    result: dict[str, Any] = {"env": env}
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:

        def load() -> None:
            if start_load.wait(120):
                run = wrk.run(srv.base + "/", background, 4, seconds, backoff_ms=50)
                result["background"] = run.summary()

        loader = threading.Thread(target=load, name="background-load", daemon=True)
        loader.start()
        try:
            result.update(client.run(measure(srv.base, args, start_load)))
        finally:
            start_load.set()
            loader.join(seconds + 60)
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
            f"floor bursts); MAX_QUEUE_SIZE=8; background wrk 4 connections (mixed inputs) "
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
