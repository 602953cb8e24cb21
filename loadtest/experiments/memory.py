"""Memory under sustained overload: does the worker's RSS level off?

``python -m loadtest.experiments.bench --only memory`` (about 21 minutes; ``--minutes 2`` about
5). Two phases, each on a fresh server with the storm's settings (``MAX_QUEUE_SIZE=64
REQUEST_TIMEOUT_S=2``, the 3-sentence input):

- ``differing``: 256 wrk connections resending at once on 503, each request another
  sentence of the held-out corpus (``storm_kinds``' ``differing`` bodies), ``--minutes`` long;
- ``overload``: open loop (aiohttp, ``loadtest.client.open_loop``) at twice the capacity of 32
  polite clients, measured first, on the same differing bodies, ``--minutes`` long (latency
  counted from each request's scheduled time);
- ``storm`` (not in the default phases): as ``differing``, the same body always.

The worker's RSS is sampled every ``--memory-interval`` seconds (10) from the load's start.
Target: RSS at the end within 5% of RSS at half time.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

from loadtest import client, servers, wrk
from loadtest.workloads import common, storm, storm_kinds

NAME = "memory"
PHASES = ("differing", "overload")
GROWTH_TARGET = 0.05


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--minutes", type=float, help="memory: minutes per phase (default 10)")
    p.add_argument("--memory-interval", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--memory-phases", default=",".join(PHASES), help="phases to run")
    p.add_argument(
        "--overload-multiple", type=float, default=2.0, help="open-loop rate, x capacity"
    )


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.minutes = args.minutes or (2.0 if args.quick else 10.0)
    args.memory_phases = args.memory_phases.split(",")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` now."""
    return int(psutil.Process(pid).memory_info().rss)


class RssSampler:
    """RSS of ``pid`` every ``interval_s`` in a thread: (seconds since start, bytes)."""

    def __init__(self, pid: int, interval_s: float, max_samples: int = 10_000) -> None:
        self.pid, self.interval_s, self.max_samples = pid, interval_s, max_samples
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.samples

    def _run(self) -> None:
        started = time.monotonic()
        while len(self.samples) < self.max_samples:
            try:
                self.samples.append((time.monotonic() - started, rss_bytes(self.pid)))
            except Exception:  # the process exited
                return
            if self._stop.wait(self.interval_s):
                return


def at(samples: list[tuple[float, int]], seconds: float) -> int:
    """The RSS sample nearest to ``seconds`` after the start."""
    return min(samples, key=lambda s: abs(s[0] - seconds))[1]


def growth(samples: list[tuple[float, int]], total_s: float) -> dict[str, float]:
    """RSS at half time and at the end (MB), and the end's growth over half time (0-1)."""
    half, end = at(samples, total_s / 2), at(samples, total_s)
    return {"rss_half_mb": half / 2**20, "rss_end_mb": end / 2**20, "growth": end / half - 1}


def phase(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One phase on a fresh server (module docstring)."""
    body = common.json_body(storm.storm_input())
    bodies = [body] if name == "storm" else storm_kinds.body_sets(storm.storm_input())["differing"]
    seconds = args.minutes * 60
    env = common.server_env(args, **storm.SETTINGS)
    with servers.pipeline_server(env, args.results / f"{NAME}-{name}.log") as srv:
        wrk.run(srv.base + "/", [body], 8, 2)  # warm up
        cap = storm.capacity(srv, body, 5)
        rss_start = rss_bytes(srv.worker_pid)
        sampler = RssSampler(srv.worker_pid, args.memory_interval)
        sampler.start()
        try:
            load = _load(name, srv, bodies, cap["ok_per_s"], seconds, args)
        finally:
            samples = sampler.stop()
    res = {"capacity_per_s": cap["ok_per_s"], "seconds": seconds, "load": load}
    res["rss_before_load_mb"] = rss_start / 2**20
    res["series"] = [(round(t, 1), round(b / 2**20, 1)) for t, b in samples]
    res.update(growth(samples, seconds))
    print(
        f"  {name}: RSS {res['rss_before_load_mb']:.0f} MB before, {res['rss_half_mb']:.0f} MB "
        f"at {args.minutes / 2:g} min, {res['rss_end_mb']:.0f} MB at {args.minutes:g} min "
        f"({res['growth']:+.1%})",
        flush=True,
    )
    return res


def _load(
    name: str,
    srv: servers.Served,
    bodies: list[bytes],
    capacity_per_s: float,
    seconds: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    if name != "overload":  # a storm: wrk, the next request the moment an answer arrives
        run = wrk.run(srv.base + "/", bodies, storm.STORM_CLIENTS, seconds, count_statuses=True)
        return {**run.summary(), "shed_per_s": run.per_s(503)}
    rate = args.overload_multiple * capacity_per_s
    reqs = [client.Request("POST", "/", b, (("Content-Type", common.JSON),)) for b in bodies]
    result = client.run(client.open_loop(srv.base, reqs, rate, seconds, max_in_flight=1000))
    return {"rate_per_s": rate, **result.summary()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    return {"minutes": args.minutes, "phases": {n: phase(n, args) for n in args.memory_phases}}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Memory: {result['minutes']:g} minutes per phase, the worker's RSS (MB) sampled every "
        "few seconds from the load's start.",
        "",
        "| phase | capacity/s | load | goodput/s | RSS before | RSS at half | RSS at end | growth "
        "| target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in result["phases"].items():
        load = r["load"]
        what = (
            f"{load.get('connections', '')} wrk connections"
            if name != "overload"
            else f"open loop {load['rate_per_s']:.0f}/s"
        )
        good = load.get("ok_per_s", load.get("requests_per_s", float("nan")))
        lines.append(
            f"| {name} | {r['capacity_per_s']:.1f} | {what} | {good:.1f} | "
            f"{r['rss_before_load_mb']:.0f} | {r['rss_half_mb']:.0f} | {r['rss_end_mb']:.0f} | "
            f"{r['growth']:+.1%} | within {GROWTH_TARGET:.0%} |"
        )
    lines.append("")
    for name, r in result["phases"].items():
        series = ", ".join(f"{t:.0f}s {mb:.0f}" for t, mb in r["series"])
        lines.append(f"- {name} RSS series (s MB): {series}")
    return "\n".join(lines)
