"""Interactive latency beside a bulk indexer: does a one-input request wait behind 1,000 inputs?

``python -m loadtest.bench --only bulk`` (about 4 minutes; ``--quick`` about 2). One server on
the default model and settings. Interactive clients (``--bulk-clients``, 4) send one short input
a request to ``/embed`` (``corpus.short_inputs``, 42 tokens mean), open loop at ``--bulk-rate``
requests a second in all (well under capacity), for ``--bulk-seconds``: first alone, then
beside an indexer: one client sending ``/v1/embeddings`` requests of ``--bulk-chunks`` inputs
(LangChain's default chunk, 1,000; OpenAI's limit, 2,048) back to back, base64-encoded as the
openai SDK asks, on passages of the mixed set that fit the model (:func:`indexer_passages`:
7-256 tokens, 64 mean), waiting out a 503's Retry-After; the two start together. Rounds
alternate: the interactive clients alone, beside the indexer, then the indexer alone (its
rate without interactive traffic: what slicing bulk batches costs it), ``--bulk-rounds`` times
(at least 2), so drift shows; the figures are medians over rounds. Goal: the interactive p99
beside the indexer within 2x its value alone.

The indexer's rate is counted from the server's ``batch`` log lines (bulk inputs computed in
the phase a second), not from its answers: a 1,000-input request takes longer than a short
phase, and the one in flight when a phase ends is abandoned (the server drops its inputs).
The same lines say how batches were made up: how many bulk inputs rode with an interactive one,
and how long batches with and without bulk inputs ran.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from loadtest import client, corpus, servers
from loadtest.stats import percentile
from loadtest.workloads import common

NAME = "bulk"
GOAL = 2.0  # interactive p99 beside the indexer / alone, at most
_SETTLE_S = 1.0  # between phases: the abandoned bulk request's inputs are dropped


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--bulk-seconds", type=float, help="per phase (default 30, quick 10)")
    p.add_argument("--bulk-rounds", type=int, help="alone/with-indexer rounds (default 2)")
    p.add_argument("--bulk-rate", type=float, default=20.0, help="interactive requests/s in all")
    p.add_argument("--bulk-clients", type=int, default=4, help="interactive open-loop clients")
    p.add_argument("--bulk-chunks", default="1000", help="indexer inputs per request (1000,2048)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.bulk_seconds = args.bulk_seconds or (10.0 if args.quick else 30.0)
    args.bulk_rounds = max(2, args.bulk_rounds or 2)
    args.bulk_chunks = common.ints(args.bulk_chunks)


def run(args: argparse.Namespace) -> dict[str, Any]:
    short = corpus.short_inputs(500)
    passages = indexer_passages(max(args.bulk_chunks))
    env = common.server_env(args)
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:
        whole = common.get_json(srv.base + "/info") or {}
        rounds = client.run(_rounds(srv, short, passages, args))
    info = whole.get("model") or {}
    backend = info.get("backend") or {}
    out: dict[str, Any] = {
        "model": info.get("served_name") or info.get("model_id"),
        "backend": f"{backend.get('name')} {backend.get('dtype')} ({backend.get('compute')})",
        "batching": whole.get("batching"),
        "rate_per_s": args.bulk_rate,
        "clients": args.bulk_clients,
        "seconds": args.bulk_seconds,
        "rounds": rounds,
    }
    out["summary"] = summarize(rounds, args.bulk_chunks)
    return out


def indexer_passages(n: int, max_tokens: int = 256) -> list[str]:
    """``n`` passages of the mixed set (``corpus.mixed_inputs``: a few words to a few hundred
    tokens) that fit the default model's ``max_tokens``, as a text splitter's chunks would: the
    longer ones are dropped, so the same ``n`` gives the same list."""
    tok = corpus._default_tokenizer()
    drawn = corpus.mixed_inputs(3 * n)
    lengths = [len(ids) for ids in tok(drawn)["input_ids"]]
    kept = [t for t, k in zip(drawn, lengths, strict=True) if k <= max_tokens]
    return kept[:n]


async def _rounds(
    srv: servers.Served, short: list[str], passages: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each round: the interactive clients alone, then at each chunk size beside the indexer,
    then the indexer alone."""
    bodies = [json.dumps({"inputs": t}).encode() for t in short]
    reqs = [client.Request("POST", "/embed", b, (("Content-Type", common.JSON),)) for b in bodies]
    await client.closed_loop(srv.base, reqs, 4, 2.0, warmup_s=0.0)  # warm up
    out = []
    for k in range(args.bulk_rounds):
        plan = [(0, True)] + [(c, who) for c in args.bulk_chunks for who in (True, False)]
        for chunk, clients in plan:
            point = await phase(srv, reqs if clients else [], passages[:chunk], args)
            point.update(round=k + 1, chunk=chunk, interactive=clients)
            out.append(point)
            print(f"  {NAME} round {k + 1}: {_line(point)}", flush=True)
    return out


async def phase(
    srv: servers.Served,
    reqs: list[client.Request],
    chunk: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The interactive clients sending ``reqs`` for ``--bulk-seconds`` (none when empty: the
    phase only lasts as long), beside an indexer sending ``chunk`` as one request after
    another (none when empty); their latencies, the indexer's answers, and what the batches
    were made of (``batch_mix``)."""
    offset = srv.log.stat().st_size
    stop = asyncio.Event()
    answers: list[tuple[int, float]] = []
    started = time.monotonic()
    if reqs:
        # The interactive clients and the indexer start together: the interactive traffic is
        # steady when the bulk work arrives, as beside an indexer running for hours.
        clients = asyncio.create_task(interactive(srv.base, reqs, args))
        await asyncio.sleep(0)
        indexer = asyncio.create_task(index(srv.base, chunk, stop, answers)) if chunk else None
        res = await clients
    else:
        indexer = asyncio.create_task(index(srv.base, chunk, stop, answers)) if chunk else None
        await asyncio.sleep(args.bulk_seconds)
        res = client.Result(elapsed_s=args.bulk_seconds)
    window_s = time.monotonic() - started
    stop.set()
    if indexer is not None:
        indexer.cancel()  # abandon the request in flight: the server drops its inputs
        with contextlib.suppress(asyncio.CancelledError):
            await indexer
    await asyncio.sleep(_SETTLE_S)
    summary = res.summary()
    point: dict[str, Any] = {
        **{k: summary[k] for k in ("requests", "requests_per_s", "p50_ms", "p95_ms", "p99_ms")},
        "max_ms": 1000 * max((lat for _, lat, _ in res.answers), default=float("nan")),
        "non_200": sum(n for s, n in res.statuses().items() if s != 200),
        "statuses": res.statuses(),
        "dropped": res.dropped,
    }
    mix = batch_mix(_batches(srv.log, offset))
    point["batches"] = mix
    if chunk:
        point["bulk_inputs_per_s"] = mix["bulk_inputs"] / window_s
        point["indexer_answers"] = len(answers)
        point["indexer_non_200"] = sum(1 for s, _ in answers if s != 200)
        point["indexer_request_s"] = [round(lat, 2) for _, lat in answers]
    return point


async def interactive(
    base: str, reqs: list[client.Request], args: argparse.Namespace
) -> client.Result:
    """``--bulk-clients`` open-loop clients, each at its share of ``--bulk-rate``, started a
    fraction of an interval apart; one Result for all (latency from each scheduled send)."""
    n, rate = args.bulk_clients, args.bulk_rate / args.bulk_clients
    mine = [reqs[k::n] for k in range(n)]

    async def one(k: int) -> client.Result:
        await asyncio.sleep(k / args.bulk_rate)
        async with client.session(64) as http:
            return await client.arrivals(
                lambda r: client.send(http, base, r), mine[k], rate, args.bulk_seconds, 64
            )

    parts = await asyncio.gather(*(one(k) for k in range(n)))
    out = client.Result(elapsed_s=args.bulk_seconds)
    for part in parts:
        out.answers += part.answers
        out.dropped += part.dropped
    return out


async def index(
    base: str, texts: list[str], stop: asyncio.Event, out: list[tuple[int, float]]
) -> None:
    """The indexer: ``texts`` as one ``/v1/embeddings`` request after another until ``stop``
    (or until cancelled mid-request), waiting out a 503's Retry-After (at most 5 s); appends
    (status, seconds) of each answer to ``out`` (status 0: a connection error)."""
    body = json.dumps({"model": "x", "input": texts, "encoding_format": "base64"}).encode()
    await client.polite(base + "/v1/embeddings", body, stop, out, timeout_s=600)


def _batches(log: Path, offset: int) -> list[dict[str, Any]]:
    """The server's ``batch`` log lines written after ``offset``."""
    with log.open("rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    out = []
    for raw in lines:
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == "batch":
            out.append(doc)
    return out


def batch_mix(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """What the batches of a phase were made of: how many held an interactive input, the bulk
    inputs riding with one (mean, max), and the run time (ms, p50 and max) of batches with an
    interactive input and of all-bulk ones; ``bulk_inputs``: bulk inputs computed."""
    mixed = [b for b in batches if b.get("bulk", 0) < b["size"]]
    pure = [b for b in batches if b["size"] and b.get("bulk", 0) == b["size"]]
    riding = [b.get("bulk", 0) for b in mixed]
    return {
        "batches": len(batches),
        "with_interactive": len(mixed),
        "bulk_inputs": sum(b.get("bulk", 0) for b in batches),
        "bulk_beside_interactive_mean": sum(riding) / len(riding) if riding else 0.0,
        "bulk_beside_interactive_max": max(riding, default=0),
        "interactive_batch_ms_p50": percentile([b["inference_ms"] for b in mixed], 50),
        "interactive_batch_ms_max": max((b["inference_ms"] for b in mixed), default=float("nan")),
        "bulk_batch_ms_p50": percentile([b["inference_ms"] for b in pure], 50),
        "bulk_batch_ms_max": max((b["inference_ms"] for b in pure), default=float("nan")),
        "bulk_batch_size_p50": percentile([b["size"] for b in pure], 50),
    }


def summarize(rounds: list[dict[str, Any]], chunks: list[int]) -> dict[str, Any]:
    """Medians over rounds: interactive p50/p95/p99 alone and beside each chunk size, their
    ratios, the indexer's inputs/s, and the non-200 answers in all."""
    alone = [p for p in rounds if not p["chunk"]]
    out: dict[str, Any] = {"alone": _medians(alone)}
    for chunk in chunks:
        beside = [p for p in rounds if p["chunk"] == chunk and p.get("interactive", True)]
        indexer = [p for p in rounds if p["chunk"] == chunk and not p.get("interactive", True)]
        med = _medians(beside)
        med["bulk_inputs_per_s"] = common.median(p["bulk_inputs_per_s"] for p in beside)
        med["bulk_alone_inputs_per_s"] = common.median(p["bulk_inputs_per_s"] for p in indexer)
        med["indexer_non_200"] = sum(p["indexer_non_200"] for p in beside + indexer)
        for q in ("p50", "p95", "p99"):
            med[f"{q}_ratio"] = med[f"{q}_ms"] / out["alone"][f"{q}_ms"]
        out[str(chunk)] = med
    return out


def _medians(points: list[dict[str, Any]]) -> dict[str, Any]:
    med: dict[str, Any] = {
        f"{q}_ms": common.median(p[f"{q}_ms"] for p in points) for q in ("p50", "p95", "p99")
    }
    med["non_200"] = sum(p["non_200"] for p in points)
    return med


def _line(p: dict[str, Any]) -> str:
    who = f"beside {p['chunk']}-input requests" if p["chunk"] else "alone"
    if not p.get("interactive", True):
        return f"{p['chunk']}-input requests alone: indexer {p['bulk_inputs_per_s']:.1f} inputs/s"
    text = (
        f"{who}: {p['requests_per_s']:.1f} req/s, p50 {p['p50_ms']:.1f} p95 {p['p95_ms']:.1f} "
        f"p99 {p['p99_ms']:.1f} ms, non-200 {p['non_200']}"
    )
    if p["chunk"]:
        b = p["batches"]
        text += (
            f"; indexer {p['bulk_inputs_per_s']:.1f} inputs/s; bulk beside interactive "
            f"{b['bulk_beside_interactive_mean']:.1f} (max {b['bulk_beside_interactive_max']}), "
            f"batch ms p50 {common.ms(b['interactive_batch_ms_p50'])} with interactive, "
            f"{common.ms(b['bulk_batch_ms_p50'])} bulk only"
        )
    return text


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        f"Interactive latency beside a bulk indexer: {result['model']}, {result['backend']}; "
        f"{result['clients']} clients at {result['rate_per_s']:g} requests/s in all, one short "
        f"input each, {result['seconds']:g} s a phase.",
        "",
        "| round | interactive clients | indexer inputs/request | p50 ms | p95 ms | p99 ms "
        "| max ms | non-200 "
        "| indexer inputs/s | bulk beside an interactive input (mean, max) "
        "| batch ms with interactive (p50, max) | bulk-only batch ms (p50, max) |",
        "|" + " --- |" * 12,
    ]
    for p in result["rounds"]:
        b = p["batches"]
        bulk = p["chunk"] > 0
        lines.append(
            f"| {p['round']} | {'yes' if p.get('interactive', True) else 'no'} "
            f"| {p['chunk'] or '-'} | {common.ms(p['p50_ms'])} "
            f"| {common.ms(p['p95_ms'])} | {common.ms(p['p99_ms'])} | {common.ms(p['max_ms'])} "
            f"| {p['non_200']} | {common.ms(p.get('bulk_inputs_per_s'))} "
            + (
                f"| {b['bulk_beside_interactive_mean']:.1f}, {b['bulk_beside_interactive_max']} "
                f"| {common.ms(b['interactive_batch_ms_p50'])}, "
                f"{common.ms(b['interactive_batch_ms_max'])} "
                f"| {common.ms(b['bulk_batch_ms_p50'])}, {common.ms(b['bulk_batch_ms_max'])} |"
                if bulk
                else f"| - | {common.ms(b['interactive_batch_ms_p50'])}, "
                f"{common.ms(b['interactive_batch_ms_max'])} | - |"
            )
        )
    lines += ["", "Medians over rounds:", ""]
    alone = s["alone"]
    lines.append(
        f"- alone: p50 {alone['p50_ms']:.1f}, p95 {alone['p95_ms']:.1f}, "
        f"p99 {alone['p99_ms']:.1f} ms; non-200 {alone['non_200']}"
    )
    for key, med in s.items():
        if key == "alone":
            continue
        lines.append(
            f"- beside {key}-input requests: p50 {med['p50_ms']:.1f}, p95 {med['p95_ms']:.1f}, "
            f"p99 {med['p99_ms']:.1f} ms ({med['p50_ratio']:.2f}x, {med['p95_ratio']:.2f}x, "
            f"**{med['p99_ratio']:.2f}x** alone; goal p99 <= {GOAL:g}x); indexer "
            f"{med['bulk_inputs_per_s']:.1f} inputs/s ({med['bulk_alone_inputs_per_s']:.1f} "
            f"alone); non-200 {med['non_200']} interactive, "
            f"{med['indexer_non_200']} indexer"
        )
    return "\n".join(lines) + "\n"
