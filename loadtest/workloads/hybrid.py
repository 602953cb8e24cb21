"""BGE-M3's three outputs in one call against three calls, side by side in one run.

``python -m loadtest.bench --only hybrid`` (about a minute; ``--quick`` less). One server, the
real console script on torch float32, serving :func:`loadtest.models.minilm_m3` (the
all-MiniLM-L6-v2 encoder with seeded BGE-M3 heads: real compute, meaningless answers). The
same seeded documents (40-150 words of the corpus) are sent one input per request by one
client, in rounds that alternate the two ways, so both see the same machine:

- **one call**: ``/embed_hybrid`` with ``dense``, ``sparse`` and ``multi_vector``;
- **three calls**: ``/embed``, ``/embed_sparse`` and ``/embed_multi`` for the same document.

Per way: the server worker's CPU seconds per document (user + system, from /proc) and the
wall seconds per document, and one call's share of three calls'.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest import models, servers
from loadtest.workloads import common, retrieval

NAME = "hybrid"
SERVER = {"BACKEND": "torch", "DTYPE": "float32"}
ONE = (("/embed_hybrid", {"dense": True, "sparse": True, "multi_vector": True}),)
THREE = (("/embed", {}), ("/embed_sparse", {}), ("/embed_multi", {"input_type": "document"}))


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--hybrid-documents", type=int, help="documents a round (default 32, quick 8)")
    p.add_argument("--hybrid-rounds", type=int, help="rounds of each way (default 6, quick 2)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.hybrid_documents = args.hybrid_documents or (8 if args.quick else 32)
    args.hybrid_rounds = args.hybrid_rounds or (2 if args.quick else 6)


def _round(
    http: httpx.Client, srv: servers.Served, calls: Any, documents: list[str]
) -> tuple[float, float]:
    """Every document through ``calls`` (one request per route each); CPU and wall seconds."""
    cpu, wall = common.cpu_s(srv.worker_pid), time.perf_counter()
    for text in documents:
        for route, extra in calls:
            http.post(srv.base + route, json={"inputs": text, **extra}).raise_for_status()
    return common.cpu_s(srv.worker_pid) - cpu, time.perf_counter() - wall


def run(args: argparse.Namespace) -> dict[str, Any]:
    documents = retrieval.texts(args.hybrid_documents, retrieval.DOCUMENT_WORDS, seed=2)
    env = common.server_env(args, **SERVER, MODEL_ID=str(models.minilm_m3()))
    totals = {"one_call": [0.0, 0.0], "three_calls": [0.0, 0.0]}
    with (
        servers.pipeline_server(env, args.results / f"{NAME}.log") as srv,
        httpx.Client(timeout=60) as http,
    ):
        _round(http, srv, ONE + THREE, documents[:2])  # warm both ways
        for _ in range(args.hybrid_rounds):
            for way, calls in (("one_call", ONE), ("three_calls", THREE)):
                cpu, wall = _round(http, srv, calls, documents)
                totals[way][0] += cpu
                totals[way][1] += wall
        info = common.model_info(srv)
    n = args.hybrid_documents * args.hybrid_rounds
    ways = {w: {"cpu_s_per_doc": c / n, "wall_s_per_doc": t / n} for w, (c, t) in totals.items()}
    return {
        "documents": n,
        "tokens": retrieval.token_stats(documents, _tokenizer()),
        "hybrid": info.get("hybrid"),
        "ways": ways,
        "one_over_three": {
            k: ways["one_call"][k] / ways["three_calls"][k] for k in ways["one_call"]
        },
    }


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.minilm_m3())


def table(result: dict[str, Any]) -> str:
    ways, ratio = result["ways"], result["one_over_three"]
    lines = [
        f"BGE-M3 layout, {result['documents']} documents "
        f"({result['tokens']['tokens_mean']:.0f} tokens mean), one client",
        "",
        "| way | CPU ms / document | wall ms / document |",
        "| --- | --- | --- |",
    ]
    for way in ("one_call", "three_calls"):
        w = ways[way]
        lines.append(
            f"| {way} | {w['cpu_s_per_doc'] * 1e3:.2f} | {w['wall_s_per_doc'] * 1e3:.2f} |"
        )
    lines.append(f"| one / three | {ratio['cpu_s_per_doc']:.2f} | {ratio['wall_s_per_doc']:.2f} |")
    return "\n".join(lines)
