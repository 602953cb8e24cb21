"""Late chunking against chunking first, on the same documents, side by side in one run.

``python -m loadtest.bench --only late-chunking`` (about a minute; ``--quick`` less). One
server, the real console script on torch float32, serving the default model (all-MiniLM-L6-v2,
a window of 256 tokens). The documents are seeded runs of consecutive corpus sentences
(``DOCUMENT_WORDS`` words, about 100-350 tokens: some fit one window, the others are encoded
in overlapping windows), each split into its sentences: the chunks. One client sends them in
rounds that alternate the two ways, so both see the same machine:

- **late chunking**: one ``/v1/embeddings`` request a document, its chunks in order with
  ``"late_chunking": true`` (one forward over the joined text, each chunk the mean of its own
  tokens);
- **chunking first**: one ``/v1/embeddings`` request a chunk, each chunk embedded on its own
  (what a retrieval indexer that splits before embedding sends).

Per way: the server worker's CPU seconds per document (user + system, from /proc), the wall
seconds per document, and the mean cosine between the chunk vectors of one document (over its
pairs of chunks, then over the documents): late chunking keeps each chunk's context, so the
chunks of one document come out more alike. Beside them, the mean cosine between a chunk's late
vector and its vector alone.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtest import corpus, models, servers
from loadtest.workloads import common, retrieval

NAME = "late-chunking"
SERVER = {"BACKEND": "torch", "DTYPE": "float32"}
DOCUMENT_WORDS = (80, 250)
WAYS = ("late_chunking", "chunking_first")


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--late-documents", type=int, help="documents a round (default 24, quick 8)")
    p.add_argument("--late-rounds", type=int, help="rounds of each way (default 4, quick 2)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.late_documents = args.late_documents or (8 if args.quick else 24)
    args.late_rounds = args.late_rounds or (2 if args.quick else 4)


def documents(n: int, seed: int = 3) -> list[list[str]]:
    """``n`` documents, each the sentences (at least two) of a run of consecutive corpus
    sentences from a seeded start, ``DOCUMENT_WORDS`` words (min drawn, max kept)."""
    rng, sents = random.Random(seed), corpus.sentences()
    out: list[list[str]] = []
    while len(out) < n:
        start, target = rng.randrange(len(sents)), rng.randint(*DOCUMENT_WORDS)
        chunks: list[str] = []
        words = 0
        for k in range(len(sents)):
            sentence = sents[(start + k) % len(sents)]
            if words + len(sentence.split()) > DOCUMENT_WORDS[1]:
                break
            chunks.append(sentence)
            words += len(sentence.split())
            if words >= target:
                break
        if len(chunks) >= 2:
            out.append(chunks)
    return out


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    """The mean cosine over the distinct pairs of rows of ``vectors`` [n >= 2, D]."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ unit.T
    n = len(unit)
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


def mean_row_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The mean cosine between row i of ``a`` and row i of ``b`` (both [n, D])."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.mean(np.sum(a * b, axis=1)))


def _embed(http: httpx.Client, base: str, body: dict[str, Any]) -> np.ndarray:
    r = http.post(base + "/v1/embeddings", json={"model": "x", **body})
    r.raise_for_status()
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _round(
    http: httpx.Client, srv: servers.Served, way: str, docs: Sequence[list[str]]
) -> tuple[float, float, list[np.ndarray]]:
    """Every document one way: CPU and wall seconds, and each document's chunk vectors."""
    cpu, wall = common.cpu_s(srv.worker_pid), time.perf_counter()
    vectors = []
    for chunks in docs:
        if way == "late_chunking":
            vectors.append(_embed(http, srv.base, {"input": chunks, "late_chunking": True}))
        else:
            vectors.append(np.concatenate([_embed(http, srv.base, {"input": c}) for c in chunks]))
    return common.cpu_s(srv.worker_pid) - cpu, time.perf_counter() - wall, vectors


def run(args: argparse.Namespace) -> dict[str, Any]:
    docs = documents(args.late_documents)
    env = common.server_env(args, **SERVER)
    totals = {way: [0.0, 0.0] for way in WAYS}
    vectors: dict[str, list[np.ndarray]] = {}
    with (
        servers.pipeline_server(env, args.results / f"{NAME}.log") as srv,
        httpx.Client(timeout=60) as http,
    ):
        for way in WAYS:  # warm both ways
            _round(http, srv, way, docs[:2])
        for _ in range(args.late_rounds):
            for way in WAYS:
                cpu, wall, vectors[way] = _round(http, srv, way, docs)
                totals[way][0] += cpu
                totals[way][1] += wall
        info = common.model_info(srv)
    return summarize(docs, totals, vectors, args.late_rounds, _tokenizer(), info)


def summarize(
    docs: Sequence[list[str]],
    totals: dict[str, list[float]],
    vectors: dict[str, list[np.ndarray]],
    rounds: int,
    tokenizer: Any,
    info: dict[str, Any],
) -> dict[str, Any]:
    """The result: per way CPU and wall seconds per document (``totals``: sums over
    ``rounds``) and the mean within-document chunk cosine; late over first; the documents'
    tokens and how many exceed one window (``info``'s ``max_input_tokens``)."""
    n = len(docs) * rounds
    ways = {
        way: {
            "cpu_s_per_doc": totals[way][0] / n,
            "wall_s_per_doc": totals[way][1] / n,
            "requests_per_doc": 1.0 if way == "late_chunking" else _chunks_per_doc(docs),
            "chunk_cosine": float(np.mean([mean_pairwise_cosine(v) for v in vectors[way]])),
        }
        for way in WAYS
    }
    late, first = ways["late_chunking"], ways["chunking_first"]
    joined = [" ".join(chunks) for chunks in docs]
    window = int(info.get("max_input_tokens") or 256)
    lengths = [len(ids) for ids in tokenizer(joined)["input_ids"]]
    return {
        "documents": len(docs),
        "rounds": rounds,
        "chunks": sum(map(len, docs)),
        "tokens": retrieval.token_stats(joined, tokenizer),
        "window_tokens": window,
        "over_one_window": sum(length > window for length in lengths),
        "ways": ways,
        "late_over_first": {k: late[k] / first[k] for k in ("cpu_s_per_doc", "wall_s_per_doc")},
        "late_vs_alone_cosine": float(
            np.mean(
                [
                    mean_row_cosine(a, b)
                    for a, b in zip(
                        vectors["late_chunking"], vectors["chunking_first"], strict=True
                    )
                ]
            )
        ),
    }


def _chunks_per_doc(docs: Sequence[list[str]]) -> float:
    return sum(map(len, docs)) / len(docs)


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.encoder_dir())


def table(result: dict[str, Any]) -> str:
    ways, ratio, tokens = result["ways"], result["late_over_first"], result["tokens"]
    lines = [
        f"late chunking: {result['documents']} documents x {result['rounds']} rounds, "
        f"{result['chunks'] / result['documents']:.1f} sentence chunks and "
        f"{tokens['tokens_mean']:.0f} tokens a document (max {tokens['tokens_max']}; "
        f"{result['over_one_window']} over one {result['window_tokens']}-token window), "
        "one client",
        "",
        "| way | requests / document | CPU ms / document | wall ms / document "
        "| chunk cosine within a document |",
        "| --- | --- | --- | --- | --- |",
    ]
    for way in WAYS:
        w = ways[way]
        lines.append(
            f"| {way.replace('_', ' ')} | {w['requests_per_doc']:.1f} | "
            f"{w['cpu_s_per_doc'] * 1e3:.2f} | {w['wall_s_per_doc'] * 1e3:.2f} | "
            f"{w['chunk_cosine']:.3f} |"
        )
    lines.append(
        f"| late / first | - | {ratio['cpu_s_per_doc']:.2f} | {ratio['wall_s_per_doc']:.2f} | - |"
    )
    lines += [
        "",
        "a chunk's late vector against its vector alone: mean cosine "
        f"{result['late_vs_alone_cosine']:.3f}",
    ]
    return "\n".join(lines)
