"""Pooled sentence embeddings (the default answer) beside token rows on the mixed inputs.

``python -m loadtest.experiments.bench --only pooled`` (about 4 minutes). The mixed bench
measures token rows (``POOLING=none``); this runs one server of each answer in turn on the same
inputs (JSON with ``truncate``: the pooled model's limit is its max_seq_length) and levels, closed
loop (aiohttp), and prints their inputs/s and p50 side by side.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadtest import client, servers
from loadtest.corpus import mixed_inputs
from loadtest.workloads import common, mixed

NAME = "pooled"
ANSWERS = {"token rows": {"POOLING": "none"}, "pooled": {}}


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--pooled-inputs", type=int, help="mixed inputs (default 512, quick 128)")
    p.add_argument("--pooled-levels", default="16,32,64", help="closed-loop clients")
    p.add_argument("--pooled-seconds", type=float, help="seconds per point (default 8, quick 3)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.pooled_inputs = args.pooled_inputs or (128 if args.quick else 512)
    args.pooled_levels = [int(x) for x in args.pooled_levels.split(",")]
    args.pooled_seconds = args.pooled_seconds or (3.0 if args.quick else 8.0)


async def levels(env: dict[str, str], args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """One server with ``env`` on top of the bench's: closed-loop points at each level."""
    head = (("Content-Type", common.JSON),)
    bodies = [
        json.dumps({"inputs": t, "truncate": True}).encode()
        for t in mixed_inputs(args.pooled_inputs)
    ]
    reqs = [client.Request("POST", "/", body, head) for body in bodies]
    with servers.pipeline_server(
        common.server_env(args, **env), args.results / "pooled.log"
    ) as srv:
        await client.closed_loop(srv.base, reqs, 4, 2.0, warmup_s=0)
        return await mixed.closed_levels(
            srv.base, reqs, args.pooled_levels, args.pooled_seconds, args
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for answer, env in ANSWERS.items():
        print(f"{NAME}: {answer}", flush=True)
        out[answer] = client.run(levels(env, args))
    return {"answers": out}


def table(result: dict[str, Any]) -> str:
    rows, pooled = result["answers"]["token rows"], result["answers"]["pooled"]
    lines = [
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
    return "\n".join(lines)
