"""Retrieval models beside the pooled embeddings: multi-vector answers, rerankers, long inputs.

``python -m loadtest.bench --only retrieval`` (about 3-4 minutes; ``--quick`` about 1). Three
servers in turn, each the real console script on torch float32 (``SERVER``: a multi-vector
model's backend and default dtype, so the three compare like for like; ``--env BACKEND=auto``
measures the others on their chosen backend, kept in the JSON from /info), on the same seeded
queries (4-25 words) and documents (40-150 words) of the corpus (``loadtest.corpus``), one input
per request, closed loop (aiohttp, ``loadtest.client``):

1. **embeddings**: ``/embed`` on the default model (pooled, normalized: one 384-float vector
   per input) and ``/embed_multi`` on :func:`loadtest.models.minilm_multi_vector` (the same
   encoder, one 128-float vector per token kept), queries and documents apart, at each level:
   inputs/s and latency; and the bytes of one answer (the JSON body, mean over
   ``--retrieval-bytes-inputs`` inputs sent once each) with the vectors it holds;
2. **rerank**: ``/rerank`` with one query and ``--retrieval-docs-per-query`` documents a
   request, the same requests on :func:`loadtest.models.minilm_cross_encoder` (one pair a
   forward input: query and document together) and on the multi-vector model (MaxSim: the query
   and each document encoded alone, then scored): requests/s and pairs/s;
3. **long**: one document of about ``--retrieval-long-tokens`` tokens on the default model's
   server (LONG_INPUTS=chunk) sent in turn chunked (the mode's default: the model's windows)
   and truncated (``"truncate": true``: what LONG_INPUTS=truncate does for every request),
   ``--retrieval-long-repeats`` times each: the server's time per request, the pipeline's, the
   windows, and the cosine between the two vectors (``loadtest.workloads.retrieval_long``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest import client, corpus, models, servers
from loadtest.workloads import common, mixed, retrieval_long

NAME = "retrieval"
QUERY_WORDS, DOCUMENT_WORDS = (4, 25), (40, 150)
HEAD = (("Content-Type", common.JSON),)
SERVER = {"BACKEND": "torch", "DTYPE": "float32"}  # every server's, under --env


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--retrieval-parts", default="embeddings,rerank,long", help="parts to run")
    p.add_argument("--retrieval-levels", help="clients, embeddings (default 1,16)")
    p.add_argument("--retrieval-rerank-levels", help="clients, rerank (default 1,4: 64 pairs)")
    p.add_argument("--retrieval-seconds", type=float, help="per point (default 8, quick 2)")
    p.add_argument("--retrieval-inputs", type=int, help="queries and documents (default 256/64)")
    p.add_argument("--retrieval-docs-per-query", type=int, default=16, help="rerank documents")
    p.add_argument("--retrieval-bytes-inputs", type=int, help="answers weighed (default 32/8)")
    p.add_argument("--retrieval-long-tokens", type=int, default=2000, help="long document")
    p.add_argument("--retrieval-long-repeats", type=int, help="per mode (default 7, quick 3)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    q = args.quick
    args.retrieval_parts = args.retrieval_parts.split(",")
    unknown = set(args.retrieval_parts) - {"embeddings", "rerank", "long"}
    if unknown:
        raise SystemExit(f"--retrieval-parts: unknown {', '.join(sorted(unknown))}")
    args.retrieval_levels = common.ints(args.retrieval_levels or "1,16")
    args.retrieval_rerank_levels = common.ints(args.retrieval_rerank_levels or "1,4")
    args.retrieval_seconds = args.retrieval_seconds or (2.0 if q else 8.0)
    args.retrieval_inputs = args.retrieval_inputs or (64 if q else 256)
    args.retrieval_bytes_inputs = args.retrieval_bytes_inputs or (8 if q else 32)
    args.retrieval_long_repeats = args.retrieval_long_repeats or (3 if q else 7)


def texts(n: int, words: tuple[int, int], seed: int) -> list[str]:
    """``n`` runs of consecutive corpus sentences of ``words`` words (min, max), seeded."""
    rng = random.Random(seed)
    return [corpus.passage(rng, rng.randint(*words), words[1]) for _ in range(n)]


def token_stats(items: Sequence[str], tokenizer: Any) -> dict[str, float]:
    """How many ``items`` and their tokens (special tokens included): mean and max."""
    lengths = [len(ids) for ids in tokenizer(list(items))["input_ids"]]
    return {"n": len(lengths), "tokens_mean": statistics.fmean(lengths), "tokens_max": max(lengths)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    tok = corpus._default_tokenizer()
    queries = texts(args.retrieval_inputs, QUERY_WORDS, seed=1)
    documents = texts(args.retrieval_inputs, DOCUMENT_WORDS, seed=2)
    k = args.retrieval_docs_per_query
    pairs = [
        (q, [documents[(i * k + j) % len(documents)] for j in range(k)])
        for i, q in enumerate(queries)
    ]
    out: dict[str, Any] = {
        "inputs": {"query": token_stats(queries, tok), "document": token_stats(documents, tok)},
        "docs_per_query": k,
        "embeddings": {},
        "rerank": {},
    }
    parts = args.retrieval_parts
    if "embeddings" in parts or "long" in parts:
        env = common.server_env(args, **SERVER, LONG_INPUTS="chunk")
        with servers.pipeline_server(env, args.results / f"{NAME}-pooled.log") as srv:
            if "embeddings" in parts:
                print(f"{NAME}: /embed, pooled (the default model)", flush=True)
                out["embeddings"]["pooled"] = client.run(
                    embeddings(srv, "/embed", {}, queries, documents, args)
                )
            if "long" in parts:
                print(f"{NAME}: a long document, chunked and truncated", flush=True)
                text, tokens = retrieval_long.document(args.retrieval_long_tokens, tok)
                out["long"] = retrieval_long.measure(srv, text, tokens, args)
    if "embeddings" in parts or "rerank" in parts:
        env = common.server_env(args, **SERVER, MODEL_ID=str(models.minilm_multi_vector()))
        with servers.pipeline_server(env, args.results / f"{NAME}-multi-vector.log") as srv:
            if "embeddings" in parts:
                print(f"{NAME}: /embed_multi, multi-vector", flush=True)
                out["embeddings"]["multi-vector"] = client.run(
                    embeddings(srv, "/embed_multi", None, queries, documents, args)
                )
            if "rerank" in parts:
                print(f"{NAME}: /rerank, multi-vector (MaxSim)", flush=True)
                out["rerank"]["multi-vector"] = client.run(rerank(srv, pairs, args))
    if "rerank" in parts:
        env = common.server_env(args, **SERVER, MODEL_ID=str(models.minilm_cross_encoder()))
        with servers.pipeline_server(env, args.results / f"{NAME}-cross-encoder.log") as srv:
            print(f"{NAME}: /rerank, cross-encoder", flush=True)
            out["rerank"]["cross-encoder"] = client.run(rerank(srv, pairs, args))
    return out


def served(srv: servers.Served) -> dict[str, Any]:
    """What the JSON keeps of the server's /info: its model, backend and scoring."""
    info = common.model_info(srv)
    backend = info.get("backend") or {}
    multi = info.get("multi_vector") or {}
    return {
        "model": info.get("model_id"),
        "task": info.get("task"),
        "backend": f"{backend.get('name')} {backend.get('dtype')}" if backend else None,
        "dimension": multi.get("dimension") or info.get("dimension"),
        "scoring": multi.get("scoring") or info.get("score_activation"),
    }


async def embeddings(
    srv: servers.Served,
    route: str,
    extra: dict[str, Any] | None,
    queries: list[str],
    documents: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Per input type: the bytes of an answer, then the closed levels. ``extra``: the body's
    fields beside ``inputs`` (None: ``input_type``, as /embed_multi takes it)."""
    res: dict[str, Any] = served(srv)
    for input_type, items in (("query", queries), ("document", documents)):
        fields = {"input_type": input_type} if extra is None else extra
        reqs = [
            client.Request("POST", route, json.dumps({"inputs": t, **fields}).encode(), HEAD)
            for t in items
        ]
        weighed = weigh(await answers(srv.base, reqs[: args.retrieval_bytes_inputs]))
        print(f"  {input_type}: {weighed['bytes_per_answer']:,.0f} bytes an answer", flush=True)
        levels = await mixed.closed_levels(
            srv.base, reqs, args.retrieval_levels, args.retrieval_seconds, args
        )
        res[input_type] = {**weighed, "levels": levels}
    return res


async def answers(base: str, reqs: Sequence[client.Request]) -> list[bytes]:
    """Send each request once, in turn (a warm-up too): the answers' bodies. Raises on any
    status but 200 (with the answer): a refused input stops the run rather than skew it."""
    bodies = []
    async with client.session(1) as http:
        for req in reqs:
            async with http.post(base + req.path, data=req.body, headers=dict(req.headers)) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{req.path} answered {r.status}: {body[:300]!r}")
            bodies.append(body)
    return bodies


def weigh(bodies: Sequence[bytes]) -> dict[str, float]:
    """The mean bytes of an answer of one input and the mean vectors it holds (pooled: 1;
    multi-vector: the tokens kept)."""
    return {
        "bytes_per_answer": statistics.fmean(len(b) for b in bodies),
        "vectors_per_input": statistics.fmean(count_vectors(json.loads(b)[0]) for b in bodies),
    }


def count_vectors(answer: list[Any]) -> int:
    """Vectors in one input's answer: a list of floats is one, a list of lists is one each."""
    return len(answer) if answer and isinstance(answer[0], list) else 1


async def rerank(
    srv: servers.Served, pairs: list[tuple[str, list[str]]], args: argparse.Namespace
) -> dict[str, Any]:
    """Closed levels of ``/rerank`` requests (a query and its documents each: one input a
    document, so inputs/s is pairs/s)."""
    reqs = [
        client.Request(
            "POST", "/rerank", json.dumps({"query": q, "texts": docs}).encode(), HEAD, len(docs)
        )
        for q, docs in pairs
    ]
    await answers(srv.base, reqs[:2])
    levels = await mixed.closed_levels(
        srv.base, reqs, args.retrieval_rerank_levels, args.retrieval_seconds, args
    )
    return {**served(srv), "levels": levels}


def _by_level(levels: dict[Any, Any]) -> list[tuple[int, dict[str, Any]]]:
    """A point per level in order (a JSON round trip makes the levels strings)."""
    return sorted(((int(n), p) for n, p in levels.items()), key=lambda kv: kv[0])


def _non_200(point: dict[str, Any]) -> int:
    return sum(int(v) for k, v in (point.get("statuses") or {}).items() if int(k) != 200)


def table(result: dict[str, Any]) -> str:
    inp = result["inputs"]
    lines = [
        f"Retrieval: queries {inp['query']['tokens_mean']:.0f} tokens mean (max "
        f"{inp['query']['tokens_max']}), documents {inp['document']['tokens_mean']:.0f} "
        f"(max {inp['document']['tokens_max']}), {inp['query']['n']} of each; one input a "
        "request, closed loop (aiohttp).",
        "",
    ]
    if result.get("embeddings"):
        lines += _embeddings_table(result["embeddings"])
    if result.get("rerank"):
        lines += _rerank_table(result["rerank"], result["docs_per_query"])
    if result.get("long"):
        lines += retrieval_long.table_lines(result["long"])
    return "\n".join(lines)


def _embeddings_table(res: dict[str, Any]) -> list[str]:
    lines = [
        "| answer | route | backend | input type | clients | inputs/s | p50 ms | p95 ms "
        "| bytes per answer | vectors per input | non-200 |",
        "|" + " --- |" * 11,
    ]
    for answer, got in res.items():
        route = "/embed" if answer == "pooled" else "/embed_multi"
        for input_type in ("query", "document"):
            part = got[input_type]
            for n, p in _by_level(part["levels"]):
                lines.append(
                    f"| {answer} ({got.get('dimension')} floats) | {route} | {got.get('backend')} "
                    f"| {input_type} | {n} | {p['inputs_per_s']:.1f} | {common.ms(p['p50_ms'])} "
                    f"| {common.ms(p['p95_ms'])} | {part['bytes_per_answer']:,.0f} "
                    f"| {part['vectors_per_input']:.1f} | {_non_200(p)} |"
                )
    return [*lines, ""]


def _rerank_table(res: dict[str, Any], k: int) -> list[str]:
    lines = [
        f"/rerank, one query and {k} documents a request:",
        "",
        "| model | backend | scoring | clients | requests/s | pairs/s | p50 ms | p95 ms "
        "| non-200 |",
        "|" + " --- |" * 9,
    ]
    for model, got in res.items():
        for n, p in _by_level(got["levels"]):
            lines.append(
                f"| {model} | {got.get('backend')} | {got.get('scoring')} | {n} "
                f"| {p['requests_per_s']:.2f} | {p['inputs_per_s']:.1f} "
                f"| {common.ms(p['p50_ms'])} | {common.ms(p['p95_ms'])} | {_non_200(p)} |"
            )
    return [*lines, ""]
