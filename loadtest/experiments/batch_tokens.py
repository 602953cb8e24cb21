"""Which MAX_BATCH_TOKENS serves best: the default server under budgets side by side.

``python -m loadtest.experiments.bench --only batch_tokens`` (about 5 minutes; ``--quick``
about 2). One default server per budget (``--budgets``, default ``none,2048,4096,8192``:
none is MAX_BATCH_TOKENS=0, MAX_BATCH_SIZE the only cap), all started before any point, so
each idles at about no CPU while another is measured. Then ``--rounds`` rounds; in each,
every server in turn gets one closed-loop wrk point (``--budget-clients`` connections, 32 by
default, ``--budget-seconds`` each, one JSON input a request on ``POST /``) on each input set:

- short: the short corpus (about 42 tokens, at most 100), where a batch of 32 holds at most
  3,200 tokens (64: 6,400), so budgets of 4,096 (8,192) and up never bind;
- mixed: the mixed-length corpus (about 97 tokens mean; its longest inputs ask for
  truncation at the model's limit, 256 tokens for the embedded model), where they do.

It prints inputs/s, p50 and p99 per budget and input set (medians over the rounds) and each
budget's inputs/s over the unbounded server's, measured in the same round. The rounds
alternate the servers, so a machine's drift weighs on all alike.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path
from typing import Any

from loadtest import corpus, servers, wrk
from loadtest.workloads import common

NAME = "batch_tokens"
NONE = "none"


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--budgets", default=f"{NONE},2048,4096,8192", help="MAX_BATCH_TOKENS values, or none"
    )
    p.add_argument("--budget-clients", type=int, default=32, help="wrk connections")
    p.add_argument("--budget-seconds", type=int, help="seconds a point (default 12, quick 6)")
    p.add_argument("--budget-rounds", type=int, help="rounds (default 3, quick 1)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.budget_seconds = args.budget_seconds or (6 if args.quick else 12)
    args.budget_rounds = args.budget_rounds or (1 if args.quick else 3)


def budgets(text: str) -> list[str]:
    """``none,2048`` -> ["none", "2048"]; each a positive integer or none."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    for v in values:
        if v != NONE and not (v.isdigit() and int(v) > 0):
            raise ValueError(f"a budget is a positive number of tokens or {NONE}: {v!r}")
    return values


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    chosen = budgets(args.budgets)
    sets = {
        "short": [common.json_body(t) for t in corpus.short_inputs(500)],
        "mixed": [common.json_body(t, truncate=True) for t in corpus.mixed_inputs(500)],
    }
    points: dict[str, dict[str, list[dict[str, Any]]]] = {
        b: {name: [] for name in sets} for b in chosen
    }
    with contextlib.ExitStack() as stack:
        served = {}
        for b in chosen:
            env = {"MAX_BATCH_TOKENS": "0" if b == NONE else b}
            log = args.results / f"{NAME}-{b}.log"
            served[b] = stack.enter_context(
                servers.pipeline_server(common.server_env(args, **env), log)
            )
        names = {b: common.thread_names(s) for b, s in served.items()}
        for s in served.values():  # warm up: first shapes, the service-time estimate
            for bodies in sets.values():
                wrk.run(s.base + "/", bodies, 8, 2)
        for r in range(args.budget_rounds):
            order = chosen if r % 2 == 0 else chosen[::-1]
            for name, bodies in sets.items():
                for b in order:
                    point = common.wrk_point(
                        served[b], bodies, args.budget_clients, args.budget_seconds, names[b], args
                    )
                    points[b][name].append(point)
                    print(
                        f"  round {r} {name:5} MAX_BATCH_TOKENS={b:>5}: "
                        f"{point['ok_per_s']:.1f}/s, p50 {point['p50_ms']:.1f} ms, "
                        f"p99 {point['p99_ms']:.1f} ms",
                        flush=True,
                    )
    return {"budgets": chosen, "clients": args.budget_clients, "points": points}


def summary(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per input set and budget: median inputs/s, p50, p99, and the median over rounds of
    inputs/s over the unbounded server's in the same round (the first budget's, if none is
    not among them)."""
    chosen = result["budgets"]
    base = NONE if NONE in chosen else chosen[0]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in result["points"][base]:
        out[name] = {}
        for b in chosen:
            pts, ref = result["points"][b][name], result["points"][base][name]
            out[name][b] = {
                "ok_per_s": statistics.median(p["ok_per_s"] for p in pts),
                "p50_ms": statistics.median(p["p50_ms"] for p in pts),
                "p99_ms": statistics.median(p["p99_ms"] for p in pts),
                "of_base": statistics.median(
                    p["ok_per_s"] / max(q["ok_per_s"], 1e-9) for p, q in zip(pts, ref, strict=True)
                ),
            }
    return out


def table(result: dict[str, Any]) -> str:
    s = summary(result)
    base = NONE if NONE in result["budgets"] else result["budgets"][0]
    lines = [
        f"MAX_BATCH_TOKENS on the default server, {result['clients']} wrk connections, one JSON "
        "input a request; medians over the rounds.",
        "",
        f"| inputs | MAX_BATCH_TOKENS | inputs/s | of {base} | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, rows in s.items():
        for b, row in rows.items():
            lines.append(
                f"| {name} | {b} | {row['ok_per_s']:.1f} | {row['of_base']:.2f} | "
                f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
            )
    return "\n".join(lines) + "\n"
