"""Benchmark: pipeline-server's workloads, each beside its yardstick; it picks, orders, reports.

    python -m loadtest.bench                     # every workload, in the order below
    python -m loadtest.bench --only storm        # one (or a comma list: --only mixed,storm)
    python -m loadtest.bench --quick             # shorter runs of each

Each workload is a module of ``loadtest.workloads`` (see there for what it measures); this
module parses the options, runs the chosen ones in order, prints their tables and writes each
result as JSON (``results/<name>.json``; the mixed bench keeps ``results/bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from loadtest import cpu, report
from loadtest.workloads import WORKLOADS

RESULTS = Path(__file__).with_name("results")


def parse_args(
    argv: Sequence[str] | None, workloads: Mapping[str, ModuleType] = WORKLOADS
) -> argparse.Namespace:
    """The shared options, then every workload's own (``--quick`` shortens the defaults);
    ``args.workloads`` is the table the names of ``--only`` are looked up in."""
    order = list(workloads)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help=f"workloads to run (default all: {','.join(order)})")
    p.add_argument("--quick", action="store_true", help="fewer inputs, levels and seconds")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for pipeline-server (repeatable; every workload)",
    )
    p.add_argument(
        "--max-other-cpu",
        type=float,
        default=cpu.Quiet().max_other_cpu,
        help="re-measure a point when other processes took more of the CPU (0-1)",
    )
    p.add_argument("--retries", type=int, default=cpu.Quiet().retries, help="per point")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="first wait up to S seconds until other processes leave the CPU idle",
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="folder for JSON and logs")
    for name in order:
        workloads[name].add_arguments(p.add_argument_group(name))
    args = p.parse_args(argv)
    args.only = [n.strip() for n in args.only.split(",")] if args.only else order
    unknown = [n for n in args.only if n not in workloads]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(order)}")
    for name in args.only:
        workloads[name].finish_arguments(args, args.results)
    args.workloads = workloads
    return args


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one workload, print its table, write its JSON (and any extras); its result."""
    module = args.workloads[name]
    print(f"== {name}", flush=True)
    started = time.monotonic()
    machine = report.machine()
    result = module.run(args)
    machine["loadavg_after"] = os.getloadavg()
    options = {k: str(v) for k, v in vars(args).items() if k != "workloads"}
    result = {"args": options, "machine": machine, **result}
    result["wall_s"] = time.monotonic() - started
    print(module.table(result), flush=True)
    out = getattr(args, "out", None) if name == "mixed" else None
    out = out or args.results / f"{name}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    written = [out, *(module.extras(result, args) if hasattr(module, "extras") else [])]
    print(f"{name}: wrote {', '.join(map(str, written))} in {result['wall_s']:.0f} s", flush=True)
    return result


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(
    argv: Sequence[str] | None = None, workloads: Mapping[str, ModuleType] = WORKLOADS
) -> None:
    """Run the chosen workloads of ``workloads`` in order."""
    # SIGTERM (``timeout``, a CI runner) as an exception, so that every server and limit
    # process started in a ``with`` block is stopped on the way out, not left running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = parse_args(argv, workloads)
    args.results.mkdir(parents=True, exist_ok=True)
    if args.wait_quiet:
        waited = cpu.wait_quiet(args.wait_quiet)
        print(f"waited {waited:.0f} s for a quiet machine", flush=True)
    started = time.monotonic()
    for name in args.only:
        run_one(name, args)
    print(f"bench: {', '.join(args.only)} in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
