"""How fast sheds and /livez are answered while the server is saturated, beside the client floor.

    python -m loadtest.experiments.probe_latency         # starts pipeline-server (embedded model)
    python -m loadtest.experiments.probe_latency --url http://127.0.0.1:8000   # a running one

A load process keeps the queue full (concurrent clients posting long inputs without pause);
meanwhile this process, which does nothing else, probes sequentially every 10 ms:
- `/livez` of the saturated server;
- a shed: a small POST with `X-Request-Timeout: 0.05`, which deadline-aware admission refuses
  while the queue holds more than 50 ms of work (a 200 instead is counted, not timed);
- the floor: the same client against a trivial aiohttp endpoint in a third process, so the
  client's own cost (and the CPU it shares with the server: 2 cores here) is known.
All three are also measured with the server idle. Figures are from the request being on the
wire to the whole answer read (aiohttp trace), in milliseconds. Goals: sheds within
10 ms and /livez p99 within 20 ms of the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from loadtest import servers

LONG = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 25)
SHED_BODY = "Paris is the capital of France."


def _trace() -> aiohttp.TraceConfig:
    async def sent(_: Any, ctx: SimpleNamespace, __: Any) -> None:
        ctx.trace_request_ctx["sent"] = time.perf_counter()

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(sent)
    return config


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=60),
        trace_configs=[_trace()],
    )


async def _timed(
    client: aiohttp.ClientSession, method: str, url: str, **kw: Any
) -> tuple[int, float]:
    status, seconds, _ = await _timed_with_retry(client, method, url, **kw)
    return status, seconds


async def _timed_with_retry(
    client: aiohttp.ClientSession, method: str, url: str, **kw: Any
) -> tuple[int, float, float]:
    """Status, seconds on the wire, and Retry-After (0 when absent)."""
    ctx: dict[str, float] = {}
    async with client.request(method, url, trace_request_ctx=ctx, **kw) as response:
        await response.read()
        retry_after = float(response.headers.get("Retry-After", 0))
        return response.status, time.perf_counter() - ctx["sent"], retry_after


async def _probe(method: str, url: str, seconds: float, **kw: Any) -> list[tuple[int, float]]:
    """Sequential requests on one keep-alive connection, one every 10 ms, for `seconds`."""
    out: list[tuple[int, float]] = []
    async with _session() as client:
        await _timed(client, method, url, **kw)  # open the connection first
        until = time.monotonic() + seconds
        while time.monotonic() < until and len(out) < 10_000:
            out.append(await _timed(client, method, url, **kw))
            await asyncio.sleep(0.01)
    return out


def _stats(samples: list[tuple[int, float]], status: int) -> dict[str, float]:
    ms = sorted(1000 * s for st, s in samples if st == status)
    if not ms:
        return {"n": 0}
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {"n": len(ms), "p50": pick(0.5), "p99": pick(0.99), "max": ms[-1]}


async def _measure(url: str, floor_url: str, seconds: float) -> dict[str, Any]:
    shed_kw = {"data": SHED_BODY, "headers": {"X-Request-Timeout": "0.05"}}
    probes = await asyncio.gather(
        _probe("GET", url + "/livez", seconds),
        _probe("POST", url + "/", seconds, **shed_kw),
        _probe("GET", floor_url, seconds),
    )
    livez, shed, floor = probes
    return {
        "livez": _stats(livez, 200),
        "livez_not_200": sum(1 for st, _ in livez if st != 200),
        "shed": _stats(shed, 503),
        "shed_admitted": sum(1 for st, _ in shed if st != 503),
        "floor": _stats(floor, 200),
    }


async def _load(url: str, clients: int, seconds: float, storm: bool) -> dict[str, Any]:
    """The load process: `clients` loops posting LONG back to back until `seconds` pass; after
    a 503 a loop waits its Retry-After (a well-behaved client), or not at all if `storm`."""
    samples: list[tuple[int, float]] = []
    until = time.monotonic() + seconds

    async def loop(client: aiohttp.ClientSession) -> None:
        while time.monotonic() < until and len(samples) < 1_000_000:
            try:
                status, took, retry_after = await _timed_with_retry(
                    client, "POST", url + "/", data=LONG
                )
            except aiohttp.ClientError:
                status, took, retry_after = 0, 0.0, 0.0
            samples.append((status, took))
            if status == 503 and not storm:
                await asyncio.sleep(min(retry_after, max(0.0, until - time.monotonic())))

    async with _session() as client:
        await asyncio.gather(*(loop(client) for _ in range(clients)))
    statuses: dict[int, int] = {}
    for status, _ in samples:
        statuses[status] = statuses.get(status, 0) + 1
    return {"statuses": statuses, "shed_in_load": _stats(samples, 503), "ok": _stats(samples, 200)}


def _trivial_server(port: int) -> None:
    from aiohttp import web

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def _wait_http(url: str, timeout: float) -> None:
    async def once() -> int:
        async with _session() as client:
            return (await _timed(client, "GET", url))[0]

    until = time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            if asyncio.run(once()) == 200:
                return
        except aiohttp.ClientError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {timeout:.0f}s")


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "loadtest.experiments.probe_latency", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server; default: start pipeline-server")
    parser.add_argument("--seconds", type=float, default=10, help="probe time per phase")
    parser.add_argument("--clients", type=int, default=64, help="load loops (saturation)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    parser.add_argument(
        "--storm", action="store_true", help="load clients ignore Retry-After (resend at once)"
    )
    parser.add_argument("--trivial-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trivial_server:
        return _trivial_server(args.trivial_server)
    if args.load_only:
        load = _load(args.load_only, args.clients, args.seconds, args.storm)
        print(json.dumps(asyncio.run(load)))
        return None

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started: list[subprocess.Popen[bytes]] = []
    try:
        floor_port = servers.free_port()
        started.append(_spawn("--trivial-server", str(floor_port)))
        floor_url = f"http://127.0.0.1:{floor_port}/"
        url = args.url
        if url is None:
            port = servers.free_port()
            env = {"HOST": "127.0.0.1", "PORT": str(port)}
            env.update(dict(kv.split("=", 1) for kv in args.env))
            script = Path(sys.executable).with_name("pipeline-server")
            server = subprocess.Popen(
                [str(script)], env={**os.environ, **env}, stderr=subprocess.DEVNULL
            )
            started.append(server)
            url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/readyz", 180)
        _wait_http(floor_url, 30)
        idle = asyncio.run(_measure(url, floor_url, args.seconds))
        load_args = ["--load-only", url, "--clients", str(args.clients)]
        load_args += ["--seconds", str(args.seconds + 4), *(["--storm"] if args.storm else [])]
        load = _spawn(*load_args)
        started.append(load)
        time.sleep(2)  # the queue fills
        saturated = asyncio.run(_measure(url, floor_url, args.seconds))
        out, _ = load.communicate(timeout=args.seconds + 60)
        report = {
            "settings": {"clients": args.clients, "storm": args.storm, "env": args.env},
            "idle": idle,
            "saturated": saturated,
            "load": json.loads(out),
        }
        print(json.dumps(report, indent=2))
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.terminate()
                process.wait(60)
    return None


if __name__ == "__main__":
    main()
