"""The mixed-input benchmark: pipeline-server beside its limit, the seed baseline and the floor.

``python -m loadtest.bench --only mixed`` (about 12 minutes; ``--quick`` about 4). In one run
and on the same mixed-length inputs (``loadtest.corpus``) it measures:

1. the limit, in a subprocess before any server starts (``loadtest.limit``);
2. the real server (``pipeline-server`` console script, 127.0.0.1, a free port): the client floor
   (/livez at the same concurrency), closed-loop clients at each level, then the paired rounds
   (``paired``: each server point between two limit (b) points measured seconds before and
   after it by a limit process kept loaded, and one client against direct single calls in
   turn), /livez probes on the idle and on the saturated server, then open-loop overload at
   multiples of the measured capacity with a deadline (goodput, shed rate and latency, p99 of
   accepted requests);
3. the seed guide's one-at-a-time server (``loadtest.seed_server`` under uvicorn), closed loop.

Its load client is aiohttp (``loadtest.client``), as when the README's figures were taken, so
they stay reproducible. Client and server share the machine's cores, so every server figure
includes the client's CPU cost; the floor shows it.
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
import urllib.request
from pathlib import Path
from typing import Any

from loadtest import client, cpu, report, servers, split
from loadtest import limit as limit_mod
from loadtest.corpus import mixed_inputs
from loadtest.stats import latency_summary

NAME = "mixed"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This workload's options (``--quick`` changes the defaults of those not given)."""
    p.add_argument("--inputs", type=int, help="mixed inputs (default 512, quick 128)")
    p.add_argument("--levels", help="closed-loop clients (default 1,4,16,32,64; quick 1,16,64)")
    p.add_argument("--seconds", type=float, help="seconds per point (default 8, quick 3)")
    p.add_argument(
        "--paired-levels", help="clients for the paired points (default 32,64; quick 64)"
    )
    p.add_argument(
        "--paired-seconds",
        type=float,
        help="seconds per paired server point (default: about one pass over the inputs)",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of paired points")
    p.add_argument(
        "--paired-one-client",
        type=int,
        help="inputs per round timed in turn by blocks of 10: direct calls, then one client "
        "(default 250, quick 110: the inputs' lengths are spread, so a p50 over few jumps)",
    )
    p.add_argument("--overload", default="1,2,4", help="offered load, multiples of capacity")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=2.0,
        help="overload deadline sent as X-Request-Timeout (s)",
    )
    p.add_argument("--batch-sizes", help="limit batch sizes (default 1..64; quick 1,8,32)")
    p.add_argument(
        "--server-cmd",
        help="benchmark this command instead of pipeline-server "
        "({port} is replaced; it must serve /readyz)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the seed server")
    p.add_argument("--out", type=Path, help="its JSON (default: results/bench.json)")
    p.add_argument("--plot", type=Path, help="its plot (default: results/bench.png)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    """The defaults that depend on ``--quick`` and on the results folder."""
    args.inputs = args.inputs or (128 if args.quick else 512)
    args.levels = [
        int(x) for x in (args.levels or ("1,16,64" if args.quick else "1,4,16,32,64")).split(",")
    ]
    args.seconds = args.seconds or (3.0 if args.quick else 8.0)
    args.paired_one_client = args.paired_one_client or (110 if args.quick else 250)
    args.paired_levels = [
        int(x) for x in (args.paired_levels or ("64" if args.quick else "32,64")).split(",")
    ]
    # About one pass over the inputs at ~40 inputs/s, so the server does the limit's work.
    args.paired_seconds = args.paired_seconds or max(3.0, args.inputs / 40)
    args.batch_sizes = args.batch_sizes or ("1,8,32" if args.quick else "1,2,4,8,16,32,64")
    args.overload = [float(x) for x in args.overload.split(",")]
    args.out = args.out or results / "bench.json"
    args.plot = args.plot or results / "bench.png"


def measure_limit(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``loadtest.limit`` in a subprocess (nothing else running) and read its JSON."""
    out = args.out.with_name("bench-limit.json")
    cmd = [
        sys.executable,
        "-m",
        "loadtest.limit",
        "--inputs",
        str(args.inputs),
        "--batch-sizes",
        args.batch_sizes,
        "--single",
        str(min(args.inputs, 200)),
        "--seconds",
        str(min(args.seconds, 5.0)),
        "--max-other-cpu",
        str(args.max_other_cpu),
        "--retries",
        str(args.retries),
        "--out",
        str(out),
    ]
    with out.with_suffix(".log").open("wb") as log:  # its errors, if any, are there
        subprocess.run(cmd, check=True, stderr=log, timeout=600, cwd=servers.REPO_ROOT)
    return dict(json.loads(out.read_text(encoding="utf-8")))


def fetch_json(url: str) -> Any:
    """GET ``url`` and decode its JSON body (None when it fails: e.g. no /info)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def scrape_metrics(base: str) -> dict[str, float]:
    """Batch size, padding efficiency and queue figures from /metrics (sums, counts, gauges)."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:  # a server without /metrics (e.g. --server-cmd): no figures
        return {}
    wanted = ("batch_size_sum", "batch_size_count", "padding_efficiency", "queue_depth")
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        wanted_line = any(w in name for w in wanted) and "_bucket" not in name
        if line.startswith("pipeline_server_") and wanted_line:
            found[name] = float(value)
    return found


def quiet(args: argparse.Namespace) -> cpu.Quiet:
    """The retry policy for points disturbed by other processes."""
    return cpu.Quiet(args.max_other_cpu, args.retries)


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

        out[n] = await cpu.least_disturbed_async(point, quiet(args))
        print(
            f"  {n:>3} clients: {out[n]['inputs_per_s'] or out[n]['requests_per_s']:8.1f} per s  "
            f"p50 {out[n]['p50_ms']:7.1f} ms  (other processes: {out[n]['other_cpu']:.0%} CPU)",
            flush=True,
        )
    return out


async def probed(
    base: str, reqs: list[client.Request], clients: int, seconds: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """A saturated closed-loop run with /livez probed beside it."""
    stop = asyncio.Event()
    probe = asyncio.create_task(client.probe(base, stop))
    run = await client.closed_loop(base, reqs, clients, seconds)
    stop.set()
    return run.summary(), latency_summary(await probe)


async def paired(
    base: str,
    reqs: list[client.Request],
    worker: limit_mod.LimitWorker,
    batch_size: int,
    args: argparse.Namespace,
    server_log: Path | None = None,
) -> dict[str, Any]:
    """The issue's targets, each server point measured in turn with its yardstick.

    Per round: direct single calls, then one client (p50 against their p50); then limit (b) at
    ``batch_size`` (one whole pass over the inputs), a server point, limit (b) again, and so on
    for each level, so every server point sits between two limit points taken seconds apart.
    A server point lasts long enough to cover about one pass over the inputs, so both sides do
    nearly the same work. The ratio of a point is server / mean(limit before, limit after); the
    summary keeps the median over ``args.rounds`` rounds.

    With the server's log (``server_log``), each point is also split into what bounds it
    (:func:`loadtest.split.batches_alone`): the batches the server formed, replayed alone
    right after it.
    """

    def limit_b() -> float:
        def one() -> float:
            return float(worker.ask(op="b", batch_size=batch_size)["inputs_per_s"])

        return cpu.least_disturbed(one, quiet(args))[0]

    levels: dict[int, list[dict[str, float]]] = {n: [] for n in args.paired_levels}
    one_client: list[dict[str, float]] = []
    for rnd in range(1, args.rounds + 1):
        one = await split.one_client_in_turn(base, reqs, worker, args.paired_one_client)
        one_client.append({**one, "round": rnd})
        print(
            f"  round {rnd}: one client p50 {one['p50_ms']:.1f} ms, direct single call "
            f"p50 {one['single_p50_ms']:.1f} ms (the same {one['n']} inputs, in turn by blocks; "
            f"per input the server added {one['added_ms_median']:.1f} ms median)",
            flush=True,
        )
        before = limit_b()
        for n in args.paired_levels:
            offset = server_log.stat().st_size if server_log else 0
            run: dict[str, Any] = (
                await client.closed_loop(base, reqs, n, args.paired_seconds)
            ).summary()
            alone = split.batches_alone(server_log, offset, worker) if server_log else {}
            after = limit_b()
            ratio = run["inputs_per_s"] / statistics.fmean((before, after))
            levels[n].append(
                {
                    "inputs_per_s": run["inputs_per_s"],
                    "answered": run["requests"],
                    "limit_b_before": before,
                    "limit_b_after": after,
                    "ratio": ratio,
                    "round": rnd,
                    **alone,
                }
            )
            print(
                f"  round {rnd}: limit (b) {before:.1f}, {n} clients {run['inputs_per_s']:.1f}, "
                f"limit (b) {after:.1f}: ratio {ratio:.2f}",
                flush=True,
            )
            if alone:
                print(
                    f"    its {alone['batches']} batches alone: "
                    f"{alone['alone_inputs_per_s']:.1f} inputs/s; under load their forward "
                    f"took {alone['forward_slowdown']:.2f}x as long; the inference thread ran "
                    f"batches {alone['busy']:.0%} of the time",
                    flush=True,
                )
            before = after
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
    # Token rows (POOLING=none): the workload as it was before pooled answers, so its figures
    # stay comparable run to run; `pooled_levels` measures the default pooled answers beside it.
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
    with log, servers.running(cmd, port, env, log=log) as base:
        await client.closed_loop(base, reqs, 4, 2.0, warmup_s=0)
        res["info"] = fetch_json(base + "/info")
        print("client floor (/livez):", flush=True)
        floor_s = min(args.seconds, 3)
        res["floor"] = await closed_levels(base, [client.LIVEZ], args.levels, floor_s, args)
        print("pipeline-server:", flush=True)
        res["closed"] = await closed_levels(base, reqs, args.levels, args.seconds, args)
        print(f"paired with limit (b) at batch size {batch_size}:", flush=True)
        server_log = None if args.server_cmd else log_path
        res["paired"] = await paired(base, reqs, worker, batch_size, args, server_log)
        idle_stop = asyncio.Event()
        idle = asyncio.create_task(client.probe(base, idle_stop))
        await asyncio.sleep(2)
        idle_stop.set()
        res["probe_idle"] = latency_summary(await idle)
        res["saturated"], res["probe_saturated"] = await probed(
            base, reqs, max(args.levels), args.seconds
        )
        res["metrics"] = scrape_metrics(base)
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

        out["runs"][mult] = r = await cpu.least_disturbed_async(point, quiet(args))
        print(
            f"  {mult:g}x: goodput {r['goodput_per_s']:.1f}/s  shed {r['shed_rate']:.0%}  "
            f"(other processes: {r['other_cpu']:.0%} CPU)",
            flush=True,
        )
    return out


async def pooled_levels(args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """The default server (pooled sentence embeddings) at the same closed-loop levels, on the
    same inputs sent as JSON with `truncate` (its limit is the model's max_seq_length, 256)."""
    body = [
        client.Request(
            "POST",
            "/",
            json.dumps({"inputs": t, "truncate": True}).encode(),
            (("Content-Type", "application/json"),),
        )
        for t in texts
    ]
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.env)}
    port = servers.free_port()
    with servers.running(servers.pipeline_server_command(), port, env) as base:
        await client.closed_loop(base, body, 4, 2.0, warmup_s=0)
        print("pipeline-server, pooled embeddings (the default answer):", flush=True)
        return {"closed": await closed_levels(base, body, args.levels, args.seconds, args)}


async def bench_baseline(args: argparse.Namespace, reqs: list[client.Request]) -> dict[str, Any]:
    """The seed server at the same levels (it loads the model while blocking its own loop)."""
    port = servers.free_port()
    with servers.running(servers.seed_server_command(port), port, ready_path="/readyz") as base:
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
    if not args.server_cmd:
        result["pooled"] = client.run(pooled_levels(args, mixed_inputs(args.inputs)))
    if not args.no_baseline:
        result["baseline"] = client.run(bench_baseline(args, reqs))
    result["ratios"] = report.ratios(result)
    return result


def table(result: dict[str, Any]) -> str:
    """The Markdown tables and ratios (``loadtest.report``), and the pooled answers beside the
    token rows at the same levels."""
    text = report.table(result)
    pooled = result.get("pooled", {}).get("closed")
    if not pooled:
        return text
    rows = result["server"]["closed"]
    lines = [
        "",
        "Token rows (POOLING=none) beside pooled embeddings (the default), same inputs:",
        "",
        "| clients | token rows inputs/s | pooled inputs/s | token rows p50 ms | pooled p50 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n, point in pooled.items():
        row = rows.get(n, {})
        lines.append(
            f"| {n} | {row.get('inputs_per_s', 0):.1f} | {point['inputs_per_s']:.1f} | "
            f"{row.get('p50_ms', 0):.1f} | {point['p50_ms']:.1f} |"
        )
    return text + "\n".join(lines) + "\n"


def extras(result: dict[str, Any], args: argparse.Namespace) -> list[Path]:
    """The plot of throughput and p95 against clients."""
    from loadtest.plot import plot

    plot(result, args.plot)
    return [args.plot]
