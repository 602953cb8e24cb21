"""Token pooling of multi-vector documents: what it saves and what it costs the ranking.

``python -m loadtest.bench --only token-pooling`` (about a minute). One server (the real
console script, torch float32) on :func:`loadtest.models.minilm_multi_vector`; the same seeded
documents (40-150 words) and queries (4-25 words) of the corpus, side by side in one run:

- each document's token vectors from ``/embed_multi`` unpooled and with ``pool_factor`` 2 and
  4 (``--pooling-factors``): vectors per document, float32 bytes per document (vectors x
  dimension x 4, what an index stores) and the JSON answer's bytes per document;
- for each query, its ``--pooling-docs-per-query`` documents ranked by MaxSim (the sum over the
  query's vectors of the best dot product with a document vector) on pooled and on unpooled
  vectors: the top-1 agreement, the overlap of the top 3, and Kendall's tau between the two
  orders, means over the queries (1.0: the same ranking). The MaxSim is computed here, as the
  server's ``/rerank`` computes it (``service.engine.multi_vector.scoring``).

The model's projection is random (seeded), so the agreement says how much pooling moves a
ranking of this encoder's token geometry, not a retrieval benchmark's nDCG.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import models, servers
from loadtest.workloads import common
from loadtest.workloads.retrieval import DOCUMENT_WORDS, QUERY_WORDS, SERVER, texts

NAME = "token-pooling"


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--pooling-factors", default="2,4", help="pool factors beside unpooled")
    p.add_argument("--pooling-documents", type=int, help="documents (default 64, quick 16)")
    p.add_argument("--pooling-queries", type=int, help="queries (default 32, quick 8)")
    p.add_argument("--pooling-docs-per-query", type=int, default=16, help="ranked per query")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.pooling_factors = [float(f) for f in args.pooling_factors.split(",")]
    args.pooling_documents = args.pooling_documents or (16 if args.quick else 64)
    args.pooling_queries = args.pooling_queries or (8 if args.quick else 32)


def post(base: str, body: dict[str, Any]) -> tuple[list[np.ndarray], int]:
    """``/embed_multi``'s answer (each input's vectors, float32) and its body's bytes."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(base + "/embed_multi", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read()
    return [np.asarray(v, dtype=np.float32) for v in json.loads(raw)], len(raw)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    return float((query @ document.T).max(axis=1).sum())


def kendall_tau(a: list[int], b: list[int]) -> float:
    """Kendall's tau between two orders of the same items (1: equal, -1: reversed)."""
    where = {item: i for i, item in enumerate(b)}
    pairs = list(combinations(a, 2))
    agree = sum(1 if where[x] < where[y] else -1 for x, y in pairs)
    return agree / len(pairs)


def agreement(
    queries: list[np.ndarray], plain: list[np.ndarray], pooled: list[np.ndarray], k: int
) -> dict[str, float]:
    """Means over the queries of top-1 agreement, top-3 overlap and Kendall's tau between
    the MaxSim rankings of each query's ``k`` documents on ``plain`` and ``pooled`` vectors."""
    top1, top3, tau = [], [], []
    for i, q in enumerate(queries):
        docs = [(i * k + j) % len(plain) for j in range(k)]
        a = sorted(docs, key=lambda d: -maxsim(q, plain[d]))
        b = sorted(docs, key=lambda d: -maxsim(q, pooled[d]))
        top1.append(float(a[0] == b[0]))
        top3.append(len(set(a[:3]) & set(b[:3])) / 3)
        tau.append(kendall_tau(a, b))
    return {"top1": float(np.mean(top1)), "top3": float(np.mean(top3)), "tau": float(np.mean(tau))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    documents = texts(args.pooling_documents, DOCUMENT_WORDS, seed=2)
    queries = texts(args.pooling_queries, QUERY_WORDS, seed=1)
    k = min(args.pooling_docs_per_query, len(documents))
    env = common.server_env(args, **SERVER, MODEL_ID=str(models.minilm_multi_vector()))
    out: dict[str, Any] = {"documents": len(documents), "queries": len(queries), "rows": []}
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:
        body = {"input_type": "query", "truncate": True}
        query_vectors, _ = post(srv.base, {**body, "inputs": queries})
        plain: list[np.ndarray] = []
        for factor in [1.0, *args.pooling_factors]:
            fields = {"input_type": "document", "truncate": True}
            if factor != 1:
                fields["pool_factor"] = factor
            vectors, size = post(srv.base, {**fields, "inputs": documents})
            plain = plain or vectors
            n = len(documents)
            row = {
                "pool_factor": factor,
                "vectors_per_document": sum(map(len, vectors)) / n,
                "float32_bytes_per_document": sum(v.nbytes for v in vectors) / n,
                "json_bytes_per_document": size / n,
                **agreement(query_vectors, plain, vectors, k),
            }
            print(
                f"  pool_factor {factor:g}: {row['vectors_per_document']:.1f} vectors", flush=True
            )
            out["rows"].append(row)
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        f"token pooling: {result['documents']} documents, {result['queries']} queries "
        "(MaxSim ranking agreement against unpooled vectors)",
        "",
        "| pool_factor | vectors/doc | float32 bytes/doc | JSON bytes/doc | top-1 | top-3 | tau |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['pool_factor']:g} | {r['vectors_per_document']:.1f} | "
            f"{r['float32_bytes_per_document']:,.0f} | {r['json_bytes_per_document']:,.0f} | "
            f"{r['top1']:.2f} | {r['top3']:.2f} | {r['tau']:.2f} |"
        )
    return "\n".join(lines)
