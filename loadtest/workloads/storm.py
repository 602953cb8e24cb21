"""A retry storm: clients that resend the moment they are shed. How much goodput is left?

``python -m loadtest.bench --only storm`` (about 1.5 minutes; with ``--ab`` about 3). The
server runs the default model with ``MAX_QUEUE_SIZE=64 REQUEST_TIMEOUT_S=2``; every request
is one 3-sentence input (:func:`storm_input`, JSON).

Per round: capacity, the answers/s of 32 polite clients (wrk, closed loop, waiting 200 ms
after a 503: :func:`capacity`); then the storm, 256 wrk connections for ``--storm-seconds``
(wrk sends the next request the moment an answer arrives, 503 or not: no Retry-After
honoured), with a few polite clients beside it (aiohttp, a fresh connection per request,
sleeping as Retry-After says after a 503).
Goodput is 200s per second during the storm; target (issue 14): goodput / capacity >= 0.8.

``--ab KEY=VALUE`` (repeatable) runs two servers, A (the settings above plus ``--env``) and B
(A plus these), and alternates the rounds A, B, A, B, so a mechanism can be A/B'd in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp

from loadtest import client, corpus, cpu, outcomes, proc, servers, wrk
from loadtest.stats import latency_summary
from loadtest.workloads import common

NAME = "storm"
SETTINGS = {"MAX_QUEUE_SIZE": "64", "REQUEST_TIMEOUT_S": "2"}
POLITE_CLIENTS, CAPACITY_CLIENTS, STORM_CLIENTS = 4, 32, 256
GOODPUT_TARGET = 0.8


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--ab",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storm: B's settings on top of A's (repeatable); rounds alternate A, B",
    )
    p.add_argument("--storm-seconds", type=float, help="storm length (default 20, quick 8)")
    p.add_argument("--storm-rounds", type=int, help="rounds (default 1, with --ab 2)")
    p.add_argument("--storm-clients", type=int, default=STORM_CLIENTS, help="storm connections")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.storm_seconds = args.storm_seconds or (8.0 if args.quick else 20.0)
    args.storm_rounds = args.storm_rounds or (2 if args.ab else 1)


def storm_input() -> str:
    """Three consecutive sentences (the Gettysburg Address's first three, about 60 tokens)."""
    sents = corpus.sentences()
    start = next(i for i, s in enumerate(sents) if s.startswith("Four score"))
    return " ".join(sents[start : start + 3])


def capacity(srv: servers.Served, body: bytes, seconds: float) -> dict[str, Any]:
    """Answers/s of 32 polite clients (closed loop), and their statuses. Polite: a connection
    shed waits 200 ms before its next request (wrk's ``delay``), as Retry-After asks; without
    it, one shed (deadline-aware admission can shed at 32 clients when the cost estimate runs
    high) starts a resend spin that is a small storm of its own."""
    before = cpu.snapshot()
    run = wrk.run(srv.base + "/", [body], CAPACITY_CLIENTS, seconds, backoff_ms=200)
    return {**run.summary(), "other_cpu": cpu.foreign_share(before, cpu.snapshot())}


async def polite(
    base: str, body: bytes, stop: asyncio.Event, out: list[tuple[int, float]], cap_s: float = 5.0
) -> None:
    """One polite client: a fresh connection per request; after a 503, sleep what Retry-After
    says (at most ``cap_s``). Appends (status, seconds) per answer; 0 is a connection error."""
    headers = {"Content-Type": common.JSON}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=30)
    ) as http:
        while not stop.is_set() and len(out) < 100_000:
            sent = time.perf_counter()
            retry_after = None
            try:
                async with http.post(base + "/", data=body, headers=headers) as resp:
                    await resp.read()
                    status, retry_after = resp.status, resp.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            out.append((status, time.perf_counter() - sent))
            if status == 503:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), outcomes.retry_delay(retry_after, cap_s))


async def storm_with_polite(
    srv: servers.Served, body: bytes, args: argparse.Namespace, names: dict[int, str]
) -> dict[str, Any]:
    """The storm (wrk, in a thread) with polite clients beside it; per-thread CPU over it."""
    stop = asyncio.Event()
    answers: list[tuple[int, float]] = []
    tasks = [
        asyncio.create_task(polite(srv.base, body, stop, answers)) for _ in range(POLITE_CLIENTS)
    ]
    window = proc.CpuWindow(srv.worker_pid, names)
    before = cpu.snapshot()
    window.start()
    try:
        storm = await asyncio.to_thread(
            wrk.run,
            srv.base + "/",
            [body],
            args.storm_clients,
            args.storm_seconds,
            count_statuses=True,
        )
    finally:
        split = window.stop()
        stop.set()
        await asyncio.gather(*tasks)
    res = storm.summary()
    res["other_cpu"] = cpu.foreign_share(before, cpu.snapshot())
    res.update(split.summary(storm.requests, storm.ok))
    res["shed_per_s"] = storm.per_s(503)
    res["expired_per_s"] = storm.per_s(504)
    by_status: dict[int, int] = {}
    for status, _ in answers:
        by_status[status] = by_status.get(status, 0) + 1
    res["polite"] = {
        "statuses": by_status,
        "shed": latency_summary([s for st, s in answers if st == 503]),
        "ok": latency_summary([s for st, s in answers if st == 200]),
    }
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    body = common.json_body(storm_input())
    configs = {"A": common.server_env(args, **SETTINGS)}
    if args.ab:
        configs["B"] = {**configs["A"], **servers.parse_env(args.ab)}
    rounds: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        started = {
            name: stack.enter_context(
                servers.pipeline_server(env, args.results / f"{NAME}-{name}.log")
            )
            for name, env in configs.items()
        }
        names = {name: common.thread_names(srv) for name, srv in started.items()}
        for srv in started.values():  # warm up each: first calls allocate
            wrk.run(srv.base + "/", [body], 8, 2)
        for rnd in range(1, args.storm_rounds + 1):
            for name, srv in started.items():
                rounds.append(one_round(srv, body, args, names[name], name, rnd))
    return {"configs": configs, "input": storm_input(), "rounds": rounds}


def one_round(
    srv: servers.Served,
    body: bytes,
    args: argparse.Namespace,
    names: dict[int, str],
    config: str,
    rnd: int,
) -> dict[str, Any]:
    """Capacity, then the storm with polite clients beside it; their ratio."""
    cap = capacity(srv, body, 4 if args.quick else 8)
    time.sleep(1)
    res = client.run(storm_with_polite(srv, body, args, names))
    time.sleep(3)  # the queue drains (deadline 2 s) before what follows
    res.update(config=config, round=rnd, capacity=cap, capacity_per_s=cap["ok_per_s"])
    res["goodput_over_capacity"] = res["ok_per_s"] / cap["ok_per_s"]
    pol = res["polite"]
    print(
        f"  {config} round {rnd}: capacity {cap['ok_per_s']:.1f}/s; storm goodput "
        f"{res['ok_per_s']:.1f}/s ({res['goodput_over_capacity']:.2f} of capacity), sheds "
        f"{res['shed_per_s']:.0f}/s, 504s {res['expired_per_s']:.1f}/s; polite clients "
        f"{pol['statuses']}, shed p50 {common.ms(pol['shed']['p50_ms'])} ms; loop "
        f"{res['loop_ms_per_request']:.2f} ms/request",
        flush=True,
    )
    return res


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Storm: {result['args'].get('storm_clients')} wrk connections resending at once on 503, "
        f"{result['args'].get('storm_seconds')} s; one 3-sentence input; capacity = 32 polite "
        "clients. Settings: "
        + "; ".join(
            f"{k}: {' '.join(f'{a}={b}' for a, b in v.items())}"
            for k, v in result["configs"].items()
        ),
        "",
        "| config | round | capacity/s | goodput/s | goodput / capacity | sheds/s | 504/s "
        "| storm p50 ms | loop ms/req | loop cores | polite: statuses | polite shed p50 / p95 ms "
        "| polite 200 p50 / p95 ms | capacity: sheds | other CPU (capacity, storm) |",
        "|" + " --- |" * 15,
    ]
    for r in result["rounds"]:
        pol = r["polite"]
        lines.append(
            f"| {r['config']} | {r['round']} | {r['capacity_per_s']:.1f} | {r['ok_per_s']:.1f} | "
            f"{r['goodput_over_capacity']:.2f} | {r['shed_per_s']:.0f} | "
            f"{r['expired_per_s']:.1f} | {common.ms(r['p50_ms'])} | "
            f"{r['loop_ms_per_request']:.3f} | {r.get('loop_cores', 0):.2f} | {pol['statuses']} | "
            f"{common.ms(pol['shed']['p50_ms'])} / {common.ms(pol['shed']['p95_ms'])} | "
            f"{common.ms(pol['ok']['p50_ms'])} / {common.ms(pol['ok']['p95_ms'])} | "
            f"{_sheds(r['capacity'])} | {r['capacity'].get('other_cpu', 0):.0%}, "
            f"{r.get('other_cpu', 0):.0%} |"
        )
    lines += ["", f"Target (issue 14): goodput / capacity >= {GOODPUT_TARGET}."]
    return "\n".join(lines)


def _sheds(point: dict[str, Any]) -> int:
    """503s in a point (status keys are ints in process, strings after JSON)."""
    return sum(n for status, n in point.get("statuses", {}).items() if int(status) == 503)
