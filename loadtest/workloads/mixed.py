"""The mixed-input benchmark: pipeline-server beside its limit, the seed baseline and the floor.

``python -m loadtest.bench --only mixed`` (about 12 minutes; ``--quick`` about 4). In one run
and on the same mixed-length inputs (``loadtest.corpus``) it measures:

1. the limit, in a subprocess before any server starts (``loadtest.limit``);
2. the real server: the client floor (/livez at the same concurrency), closed-loop clients at
   each level, the paired rounds (:func:`paired`), then open-loop overload at multiples of the
   measured capacity with a deadline (goodput, shed rate and latency, p99 of accepted requests);
3. the seed guide's one-at-a-time server (``loadtest.seed_server`` under uvicorn), closed loop.

The load client is aiohttp (``loadtest.client``). Client and server share the machine's cores,
so every server figure includes the client's CPU cost; the floor shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtest import client, cpu, report, servers, split
from loadtest import limit as limit_mod
from loadtest.corpus import mixed_inputs
from loadtest.workloads import common

NAME = "mixed"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This workload's options (``--quick`` changes the defaults of those not given)."""
    p.add_argument("--inputs", type=int, help="mixed inputs (default 512, quick 128)")
    p.add_argument("--levels", help="closed-loop clients (default 1,4,16,32,64; quick 1,16,64)")
    p.add_argument("--seconds", type=float, help="seconds per point (default 8, quick 3)")
    p.add_argument("--paired-levels", help="paired points' clients (default 32,64; quick 64)")
    p.add_argument("--paired-seconds", type=float, help="per paired point (default: ~one pass)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of paired points")
    p.add_argument(
        "--paired-one-client",
        type=int,
        help="inputs per round timed in turn by blocks of 10: direct calls, then one client "
        "(default 250, quick 110: the inputs' lengths are spread, so a p50 over few jumps)",
    )
    p.add_argument("--overload", default="1,2,4", help="offered load, multiples of capacity")
    p.add_argument("--deadline-s", type=float, default=2.0, help="overload's X-Request-Timeout")
    p.add_argument("--batch-sizes", help="limit batch sizes (default 1..64; quick 1,8,32)")
    p.add_argument("--server-cmd", help="serve with this ({port} replaced; must serve /readyz)")
    p.add_argument("--no-baseline", action="store_true", help="skip the seed server")
    p.add_argument("--out", type=Path, help="its JSON (default: results/bench.json)")
    p.add_argument("--plot", type=Path, help="its plot (default: results/bench.png)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    """The defaults that depend on ``--quick`` and on the results folder."""
    args.inputs = args.inputs or (128 if args.quick else 512)
    args.levels = common.ints(args.levels or ("1,16,64" if args.quick else "1,4,16,32,64"))
    args.seconds = args.seconds or (3.0 if args.quick else 8.0)
    args.paired_one_client = args.paired_one_client or (110 if args.quick else 250)
    args.paired_levels = common.ints(args.paired_levels or ("64" if args.quick else "32,64"))
    # About one pass over the inputs at ~40 inputs/s, so the server does the limit's work.
    args.paired_seconds = args.paired_seconds or max(3.0, args.inputs / 40)
    args.batch_sizes = args.batch_sizes or ("1,8,32" if args.quick else "1,2,4,8,16,32,64")
    args.overload = [float(x) for x in args.overload.split(",")]
    args.out = args.out or results / "bench.json"
    args.plot = args.plot or results / "bench.png"


def measure_limit(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``loadtest.limit`` in a subprocess (nothing else running) and read its JSON."""
    out = args.out.with_name("bench-limit.json")
    options = {
        "--inputs": args.inputs,
        "--batch-sizes": args.batch_sizes,
        "--single": min(args.inputs, 200),
        "--seconds": min(args.seconds, 5.0),
        "--max-other-cpu": args.max_other_cpu,
        "--retries": args.retries,
        "--out": out,
    }
    cmd = [sys.executable, "-m", "loadtest.limit", *(str(x) for kv in options.items() for x in kv)]
    with out.with_suffix(".log").open("wb") as log:  # its errors, if any, are there
        subprocess.run(cmd, check=True, stderr=log, timeout=600, cwd=servers.REPO_ROOT)
    return dict(json.loads(out.read_text(encoding="utf-8")))


async def closed_levels(
    base: str,
    reqs: list[client.Request],
    levels: list[int],
    seconds: float,
    args: argparse.Namespace,
) -> dict[int, dict[str, Any]]:
    """Closed-loop summary per concurrency level (1 s warm-up each; disturbed points retried)."""
    out: dict[int, dict[str, Any]] = {}
    for n in levels:

        async def point(n: int = n) -> dict[str, Any]:
            return (await client.closed_loop(base, reqs, n, seconds)).summary()

        out[n] = await cpu.least_disturbed_async(point, common.quiet(args))
        print(
            f"  {n:>3} clients: {out[n]['inputs_per_s'] or out[n]['requests_per_s']:8.1f} per s  "
            f"p50 {out[n]['p50_ms']:7.1f} ms  (other processes: {out[n]['other_cpu']:.0%} CPU)",
            flush=True,
        )
    return out


async def paired(
    base: str,
    reqs: list[client.Request],
    worker: limit_mod.LimitWorker,
    batch_size: int,
    args: argparse.Namespace,
    server_log: Path | None = None,
) -> dict[str, Any]:
    """The targets' figures: :func:`loadtest.split.paired_rounds` with limit (b) at
    ``batch_size`` (one whole pass over the inputs) and closed-loop server points long enough to
    cover about one pass too, so both sides do nearly the same work; medians over the rounds."""

    async def point(n: int) -> dict[str, Any]:
        return (await client.closed_loop(base, reqs, n, args.paired_seconds)).summary()

    levels, one_client = await split.paired_rounds(
        args.rounds,
        args.paired_levels,
        lambda: common.limit_b(worker, batch_size, args),
        lambda: split.one_client_in_turn(base, reqs, worker, args.paired_one_client),
        point,
        server_log,
        worker,
    )
    return {
        "batch_size": batch_size,
        "levels": levels,
        "one_client": one_client,
        "median_ratio": {n: statistics.median(p["ratio"] for p in ps) for n, ps in levels.items()},
        "one_client_p50_ms": statistics.median(p["p50_ms"] for p in one_client),
        "single_call_p50_ms": statistics.median(p["single_p50_ms"] for p in one_client),
    }


async def bench_server(
    args: argparse.Namespace,
    reqs: list[client.Request],
    worker: limit_mod.LimitWorker,
    batch_size: int,
) -> dict[str, Any]:
    """Every measurement against the real server, in one server process; ``worker`` measures
    the limit in turn with it (:func:`paired`)."""
    # Token rows (POOLING=none), as the figures of docs/benchmarks.md were taken (the default
    # pooled answers beside them: loadtest.experiments.pooled).
    env = {**os.environ, "POOLING": "none", **dict(kv.split("=", 1) for kv in args.env)}
    port = servers.free_port()
    log_path = args.out.with_name("bench-server.log")
    log = log_path.open("wb")
    res: dict[str, Any] = {"env": dict(kv.split("=", 1) for kv in args.env)}
    cmd = (
        [part.replace("{port}", str(port)) for part in shlex.split(args.server_cmd)]
        if args.server_cmd
        else servers.pipeline_server_command()
    )
    with log, servers.started(cmd, port, env, log=log) as (base, _):
        await client.closed_loop(base, reqs, 4, 2.0, warmup_s=0)
        res["info"] = common.get_json(base + "/info")
        print("client floor (/livez):", flush=True)
        floor_s = min(args.seconds, 3)
        res["floor"] = await closed_levels(base, [client.LIVEZ], args.levels, floor_s, args)
        print("pipeline-server:", flush=True)
        res["closed"] = await closed_levels(base, reqs, args.levels, args.seconds, args)
        print(f"paired with limit (b) at batch size {batch_size}:", flush=True)
        server_log = None if args.server_cmd else log_path
        res["paired"] = await paired(base, reqs, worker, batch_size, args, server_log)
        res["overload"] = await overload(base, args, reqs, res["closed"])
    return res


async def overload(
    base: str,
    args: argparse.Namespace,
    reqs: list[client.Request],
    closed: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    """Open-loop runs at multiples of the closed-loop capacity, plus the client's open floor."""
    capacity = max(r["requests_per_s"] for r in closed.values())
    timed = [
        client.Request(
            r.method, r.path, r.body, (*r.headers, ("X-Request-Timeout", f"{args.deadline_s:g}"))
        )
        for r in reqs
    ]
    top = max(args.overload) * capacity
    floor = (await client.open_loop(base, [client.LIVEZ], top, min(args.seconds, 3))).summary()
    out: dict[str, Any] = {
        "capacity_per_s": capacity,
        "deadline_s": args.deadline_s,
        "floor": floor,
        "runs": {},
    }
    print(f"overload (capacity {capacity:.1f}/s, deadline {args.deadline_s:g} s):", flush=True)
    for mult in args.overload:

        async def point(mult: float = mult) -> dict[str, Any]:
            run = await client.open_loop(base, timed, mult * capacity, args.seconds)
            await asyncio.sleep(args.deadline_s + 1)  # let the queue drain before what follows
            return run.summary(deadline_s=args.deadline_s)

        out["runs"][mult] = r = await cpu.least_disturbed_async(point, common.quiet(args))
        print(
            f"  {mult:g}x: goodput {r['goodput_per_s']:.1f}/s  shed {r['shed_rate']:.0%}  "
            f"(other processes: {r['other_cpu']:.0%} CPU)",
            flush=True,
        )
    return out


async def bench_baseline(args: argparse.Namespace, reqs: list[client.Request]) -> dict[str, Any]:
    """The seed server at the same levels (it loads the model while blocking its own loop)."""
    port = servers.free_port()
    with servers.started(servers.seed_server_command(port), port) as (base, _):
        await client.closed_loop(base, reqs, 1, 2.0, warmup_s=0)
        print("seed baseline:", flush=True)
        return {"closed": await closed_levels(base, reqs, args.levels, args.seconds, args)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The limit, the server, then the seed baseline; the result ``table`` and ``extras`` read."""
    print(f"limit: {args.inputs} inputs, batch sizes {args.batch_sizes} ...", flush=True)
    limit = measure_limit(args)  # its "other_cpu": the worst of its points, waits excluded
    print(
        f"  limit (a) {limit['limit_a']:.1f}/s, (b) {limit['limit_b']:.1f}/s  "
        f"(other processes: {limit['other_cpu']:.0%} CPU)",
        flush=True,
    )
    reqs = [client.raw_text(text) for text in mixed_inputs(args.inputs)]
    result: dict[str, Any] = {"limit": limit}
    with args.out.with_name("bench-limit-worker.log").open("wb") as worker_log:
        worker = limit_mod.LimitWorker(
            args.inputs, servers.REPO_ROOT, worker_log, env={"POOLING": "none"}
        )  # its replay runs the token-row server's engine
        try:
            result["server"] = client.run(
                bench_server(args, reqs, worker, int(limit["limit_b_batch_size"]))
            )
        finally:
            worker.close()
    if not args.no_baseline:
        result["baseline"] = client.run(bench_baseline(args, reqs))
    result["ratios"] = report.ratios(result)
    return result


def table(result: dict[str, Any]) -> str:
    """The Markdown tables and ratios (``loadtest.report``)."""
    return report.table(result)


def extras(result: dict[str, Any], args: argparse.Namespace) -> list[Path]:
    """The plot of throughput and p95 against clients."""
    from loadtest.plot import plot

    plot(result, args.plot)
    return [args.plot]
