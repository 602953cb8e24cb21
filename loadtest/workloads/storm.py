"""Retry storms and overload: clients that do not wait when shed. How much goodput is left?

``python -m loadtest.bench --only storm`` (about 3 minutes; with ``--ab`` about 10). The server
runs the default model with ``MAX_QUEUE_SIZE=64 REQUEST_TIMEOUT_S=2``. Per round and storm kind
(``storm_kinds``): capacity, the answers/s of 32 polite clients on the kind's bodies
(:func:`capacity`), measured just before and just after the storm (:func:`judge`); the storm for
``--storm-seconds``, with polite clients (sleeping as Retry-After says) and probes beside it.
Goodput is 200s per second during the storm; target: goodput / capacity >= 0.8 in each kind.
The server's counters before and after say which mechanism acted (sheds, held requests, the
loop CPU sheds took). A storm disturbed by other processes is measured again
(:func:`measured`). ``--ab KEY=VALUE`` (repeatable) runs two servers, A (the settings above
plus ``--env``) and B (A plus these), rounds alternating A, B, so a mechanism is A/B'd in one
run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

from loadtest import client, corpus, cpu, proc, servers, wrk
from loadtest.stats import latency_summary
from loadtest.workloads import common, storm_kinds
from loadtest.workloads.storm_kinds import KINDS, Kind

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
    p.add_argument(
        "--storm-kinds",
        type=lambda text: text.split(","),
        default=[k.name for k in KINDS],
        help=f"storm kinds, comma-separated (default all: {','.join(k.name for k in KINDS)})",
    )


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.storm_seconds = args.storm_seconds or (8.0 if args.quick else 15.0)
    known = {k.name for k in KINDS}
    if unknown := set(args.storm_kinds) - known:
        raise SystemExit(f"--storm-kinds: unknown {sorted(unknown)}; known {sorted(known)}")
    args.storm_rounds = args.storm_rounds or (2 if args.ab else 1)


def storm_input() -> str:
    """Three consecutive sentences (the Gettysburg Address's first three, about 60 tokens)."""
    sents = corpus.sentences()
    start = next(i for i, s in enumerate(sents) if s.startswith("Four score"))
    return " ".join(sents[start : start + 3])


def capacity(srv: servers.Served, body: bytes | list[bytes], seconds: float) -> dict[str, Any]:
    """Answers/s of 32 polite clients (closed loop), and their statuses. Polite: a connection
    shed waits 200 ms before its next request (wrk's ``delay``), as Retry-After asks; without
    it, one shed starts a resend spin that is a small storm of its own."""
    counted = storm_kinds.counters(srv.base)
    before = cpu.snapshot()
    bodies = body if isinstance(body, list) else [body]
    run = wrk.run(srv.base + "/", bodies, CAPACITY_CLIENTS, seconds, backoff_ms=200)
    after = cpu.snapshot()
    acted = _difference(counted, storm_kinds.counters(srv.base))
    return {
        **run.summary(),
        "other_cpu": cpu.foreign_share(before, after),
        "client_cores": cpu.client_cores(before, after),
        "batching": storm_kinds.batching(acted),
    }


def _difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each counter's growth between two reads of ``storm_kinds.counters``."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


async def storm_with_polite(
    srv: servers.Served,
    kind: Kind,
    bodies: list[bytes],
    open_rate: float,
    args: argparse.Namespace,
    names: dict[int, str],
) -> dict[str, Any]:
    """The storm (wrk in a thread, or the open loop at ``open_rate`` arrivals/s) with polite
    clients and probes beside it; per-thread CPU and the server's counters over it."""
    stop = asyncio.Event()
    answers: list[tuple[int, float]] = []
    probed: list[tuple[str, int, float]] = []
    tasks = [
        asyncio.create_task(
            client.polite(srv.base + "/", bodies[0], stop, answers, fresh_connections=True)
        )
        for _ in range(POLITE_CLIENTS)
    ]
    tasks.append(asyncio.create_task(storm_kinds.probes(srv.base, stop, probed)))
    counted = storm_kinds.counters(srv.base)
    window = proc.CpuWindow(srv.worker_pid, names)
    before = cpu.snapshot()
    window.start()
    try:
        if kind.connections:
            res = await asyncio.to_thread(
                storm_kinds.closed_loop, srv, bodies, kind, args.storm_seconds
            )
        else:
            res = await storm_kinds.open_loop(srv, bodies, open_rate, args.storm_seconds)
    finally:
        split = window.stop()
        stop.set()
        await asyncio.gather(*tasks)
    after = storm_kinds.counters(srv.base)
    res["acted"] = _difference(counted, after)
    res["batching"] = storm_kinds.batching(res["acted"])
    end = cpu.snapshot()
    res["other_cpu"] = cpu.foreign_share(before, end)
    res["client_cores"] = cpu.client_cores(before, end)  # wrk or the open loop, polite, probes
    res.update(split.summary(int(res["requests"]), int(res["ok_per_s"] * args.storm_seconds)))
    res["polite"] = {
        "statuses": dict(Counter(status for status, _ in answers)),
        "shed": latency_summary([s for st, s in answers if st == 503]),
        "ok": latency_summary([s for st, s in answers if st == 200]),
    }
    res["probes"] = storm_kinds.probe_summary(probed)
    res["alive"] = psutil.pid_exists(srv.worker_pid)
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    sets = storm_kinds.body_sets(storm_input())
    kinds = [k for k in KINDS if k.name in args.storm_kinds]
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
            wrk.run(srv.base + "/", sets["differing"], 8, 2)
        for rnd in range(1, args.storm_rounds + 1):
            # The open loop's yardstick: the first config's capacity in this round, so that A
            # and B get the same arrivals (a disturbed capacity would change B's load).
            yardstick: dict[str, float] = {}
            for name, srv in started.items():
                after: dict[str, Any] | None = None  # the last kind's capacity after its storm
                previous = ""
                for kind in kinds:
                    reuse = after if previous == kind.bodies else None
                    sets_yardstick = name == next(iter(started))
                    point, after = measured(
                        srv,
                        kind,
                        sets[kind.bodies],
                        reuse,
                        yardstick,
                        sets_yardstick,
                        args,
                        names[name],
                    )
                    previous = kind.bodies
                    rounds.append({**point, "config": name, "round": rnd, "kind": kind.name})
                    _print(rounds[-1])
    return {"configs": configs, "input": storm_input(), "rounds": rounds}


def measured(
    srv: servers.Served,
    kind: Kind,
    bodies: list[bytes],
    reuse: dict[str, Any] | None,
    yardstick: dict[str, float],
    sets_yardstick: bool,
    args: argparse.Namespace,
    names: dict[int, str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One storm judged (:func:`judge`) against the capacity before it (``reuse``: the previous
    kind's capacity after, on the same bodies; else measured) and after it. Measured again,
    capacity before included, when other processes took more of the CPU than
    ``--max-other-cpu`` (:func:`disturbed`), at most ``--retries`` times, as every other
    benchmark point; the least disturbed attempt is kept, with ``attempts``. Returns it and the
    last capacity measured after (the next kind's ``reuse``)."""
    quiet = common.quiet(args)
    seconds = 4 if args.quick else 6  # each capacity measurement
    kept: dict[str, Any] | None = None
    for attempt in range(1, quiet.retries + 2):
        before = reuse or capacity(srv, bodies, seconds)
        if reuse is None:
            time.sleep(1)
            if sets_yardstick:
                yardstick[kind.bodies] = before["ok_per_s"]
        point = one_round(srv, kind, bodies, kind.open_factor * yardstick[kind.bodies], args, names)
        after = capacity(srv, bodies, seconds)
        time.sleep(1)
        point.update(judge(point["ok_per_s"], before, after))
        if kept is None or disturbed(point) < disturbed(kept):
            kept = point
        if disturbed(point) <= quiet.max_other_cpu or attempt > quiet.retries:
            break
        print(
            f"  {kind.name}: other processes took {disturbed(point):.0%} of the CPU; again",
            flush=True,
        )
        reuse = None
        cpu.wait_quiet(quiet.wait_s)
    assert kept is not None
    kept["attempts"] = attempt
    return kept, after


def disturbed(point: dict[str, Any]) -> float:
    """The most CPU (0-1 of the machine) other processes took in the storm or either of its
    capacity measurements (host steal included: it counts as busy time none of ours used)."""
    parts = (point, point.get("capacity", {}), point.get("capacity_after", {}))
    return float(max(p.get("other_cpu", 0.0) for p in parts))


def _other(point: dict[str, Any]) -> str:
    """The table's other-CPU cell: :func:`disturbed`, and the attempts when more than one."""
    attempts = point.get("attempts", 1)
    return f"{disturbed(point):.0%}" + (f" ({attempts} attempts)" if attempts > 1 else "")


def one_round(
    srv: servers.Served,
    kind: Kind,
    bodies: list[bytes],
    open_rate: float,
    args: argparse.Namespace,
    names: dict[int, str],
) -> dict[str, Any]:
    """One storm of ``kind`` with polite clients beside it."""
    res = client.run(storm_with_polite(srv, kind, bodies, open_rate, args, names))
    time.sleep(3)  # the queue drains (deadline 2 s) before what follows
    return res


def judge(goodput: float, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Goodput over capacity, the capacity being the mean of the polite clients' answers/s
    measured just before and just after the storm (the machine's speed drifts meanwhile)."""
    cap = (before["ok_per_s"] + after["ok_per_s"]) / 2
    return {
        "capacity": before,
        "capacity_after": after,
        "capacity_per_s": cap,
        "goodput_over_capacity": goodput / max(cap, 1e-9),
    }


def _print(res: dict[str, Any]) -> None:
    """A progress line; the table at the end has every figure."""
    print(
        f"  {res['config']} round {res['round']} {res['kind']}: goodput {res['ok_per_s']:.1f}/s "
        f"of capacity {res['capacity_per_s']:.1f}/s ({res['goodput_over_capacity']:.2f}); "
        f"sheds {res['shed_per_s']:.0f}/s; other CPU {_other(res)}",
        flush=True,
    )


def _per_input_ms(r: dict[str, Any]) -> str:
    """The storm's and its capacity run's pipeline ms per input, for the table."""
    storm = r.get("batching", {}).get("pipeline_ms_per_input")
    cap = r.get("capacity", {}).get("batching", {}).get("pipeline_ms_per_input")
    return f"{common.ms(storm)} ({common.ms(cap)})"


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Storms of {result['args'].get('storm_seconds')} s each (loadtest/workloads/"
        "storm_kinds.py); capacity = 32 polite clients on the same bodies, the mean of just "
        "before and just after each storm. Settings: "
        + "; ".join(
            f"{k}: {' '.join(f'{a}={b}' for a, b in v.items())}"
            for k, v in result["configs"].items()
        ),
        "",
        "| kind | config | round | capacity/s | goodput/s | goodput / capacity | sheds/s | 504/s "
        "| polite: statuses | polite shed p50 / p95 ms | probes sent, failed, max ms "
        "| held | shed CPU s | loop cores | client cores (capacity run) | other CPU (most) "
        "| pipeline ms an input (capacity run) |",
        "|" + " --- |" * 17,
    ]
    for r in sorted(result["rounds"], key=lambda r: (r.get("kind", ""), r["round"], r["config"])):
        pol, probes, acted = r["polite"], r.get("probes", {}), r.get("acted", {})
        lines.append(
            f"| {r.get('kind', 'same')} | {r['config']} | {r['round']} | "
            f"{r['capacity_per_s']:.1f} | {r['ok_per_s']:.1f} | "
            f"{r['goodput_over_capacity']:.2f} | {r['shed_per_s']:.0f} | "
            f"{r['expired_per_s']:.1f} | {pol['statuses']} | "
            f"{common.ms(pol['shed']['p50_ms'])} / {common.ms(pol['shed']['p95_ms'])} | "
            f"{probes.get('sent', 0)}, {probes.get('failed', 0)}, "
            f"{common.ms(probes.get('max_ms'))} | {acted.get('held', 0):.0f} | "
            f"{acted.get('shed_cpu_s', 0):.2f} | {r.get('loop_cores', 0):.2f} | "
            f"{r.get('client_cores', 0):.2f} ({r['capacity'].get('client_cores', 0):.2f}) | "
            f"{_other(r)} | {_per_input_ms(r)} |"
        )
    lines += ["", f"Target: goodput / capacity >= {GOODPUT_TARGET} in each kind."]
    return "\n".join(lines)
