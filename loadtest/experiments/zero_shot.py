"""Zero-shot classification: what each candidate label costs.

``python -m loadtest.experiments.bench --only zero_shot`` (about 3 minutes; ``--quick`` about
1). The model is the real MiniLM encoder with a seeded NLI head
(:func:`minilm_nli`: real compute, untrained head); the server infers
``zero-shot-classification`` from its labels. Each request is one short input (8-100 tokens)
with k candidate labels; every label is one premise/hypothesis pair, one input of the batch.

For each k in ``--zero-shot-labels``:

- one client: requests in turn (aiohttp), latency p50, against the transformers pipeline
  called directly on the same texts and labels in this process (``batch_size=k``: all of one
  request's pairs in one forward, the pipeline's best for a single request), the server idle;
- 32 clients (wrk, closed loop): requests/s and pairs/s (requests/s x k), with the worker's
  CPU per request on the loop and per pair in the inference thread.

The cost per label: the least-squares slope of the one-client p50 over k (ms per label for a
lone request), and at 32 clients the model time per pair (1 / pairs/s), which stays flat when
pairs of different requests batch together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from loadtest import client, corpus, models, servers, wrk
from loadtest.workloads import common

NAME = "zero_shot"
LABELS = (
    "politics", "sports", "science", "business", "health", "travel", "food", "music",
    "film", "technology", "weather", "education", "crime", "religion", "art", "finance",
)  # fmt: skip
CLIENTS = 32


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--zero-shot-labels", help="label counts (default 1,2,4,8,16)")
    p.add_argument(
        "--zero-shot-one-client", type=int, help="requests in turn per k (default 40, quick 12)"
    )
    p.add_argument("--zero-shot-seconds", type=float, help="seconds per wrk point (default 8)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.zero_shot_labels = [int(x) for x in (args.zero_shot_labels or "1,2,4,8,16").split(",")]
    if max(args.zero_shot_labels) > len(LABELS):
        raise SystemExit(f"--zero-shot-labels: at most {len(LABELS)}")
    args.zero_shot_one_client = args.zero_shot_one_client or (12 if args.quick else 40)
    args.zero_shot_seconds = args.zero_shot_seconds or (3.0 if args.quick else 8.0)


def minilm_nli(folder: Path = models.MODELS / "minilm-nli") -> Path:
    """The bench's classifier with ``label2id`` {"entailment": 0, "neutral": 1,
    "contradiction": 2}, the label names the zero-shot pipeline looks for."""
    return models.minilm_classifier(folder, labels=("entailment", "neutral", "contradiction"))


def body(text: str, k: int) -> bytes:
    """``{"inputs": text, "parameters": {"candidate_labels": the first k labels}}``."""
    return json.dumps(
        {"inputs": text, "parameters": {"candidate_labels": list(LABELS[:k])}}
    ).encode()


async def one_client(base: str, texts: list[str], k: int) -> list[float]:
    """Latency (ms) of each request sent in turn on one keep-alive connection. A 503 (the
    queue still holds the previous point's abandoned work) is retried after 1 s, untimed."""
    out = []
    async with client.session(1) as http:
        for text in texts:
            req = client.Request("POST", "/", body(text, k), (("Content-Type", common.JSON),))
            for _ in range(30):
                t = time.perf_counter()
                status = await client.send(http, base, req)
                if status != 503:
                    break
                await asyncio.sleep(1.0)
            if status != 200:
                raise RuntimeError(f"zero-shot request answered {status}")
            out.append((time.perf_counter() - t) * 1000)
    return out


def direct(model: str, texts: list[str], counts: list[int]) -> dict[int, list[float]]:
    """The pipeline called directly, per k: each call's latency (ms), first call dropped."""
    from transformers import pipeline

    pipe = pipeline("zero-shot-classification", model=model)
    out: dict[int, list[float]] = {}
    for k in counts:
        labels = list(LABELS[:k])
        times = []
        for text in [texts[0], *texts]:
            t = time.perf_counter()
            pipe(text, candidate_labels=labels, batch_size=k)
            times.append((time.perf_counter() - t) * 1000)
        out[k] = times[1:]
    return out


def slope(xs: list[int], ys: list[float]) -> float:
    """The least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    model = str(minilm_nli())
    texts = corpus.short_inputs(200)
    timed = texts[: args.zero_shot_one_client]
    counts = args.zero_shot_labels
    env = common.server_env(args, MODEL_ID=model)
    points: dict[int, dict[str, Any]] = {}
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:
        task = common.model_info(srv).get("task")
        names = common.thread_names(srv)
        wrk.run(srv.base + "/", [body(t, 4) for t in texts], 8, 2)  # warm up
        for k in counts:
            lat = client.run(one_client(srv.base, [timed[0], *timed], k))[1:]
            bodies = [body(t, k) for t in texts]
            load = common.wrk_point(srv, bodies, CLIENTS, args.zero_shot_seconds, names, args)
            load["pairs_per_s"] = load["ok_per_s"] * k
            load["ms_per_pair"] = 1000 / load["pairs_per_s"] if load["pairs_per_s"] else None
            # wrk_point counts one input per request: per pair, divide by k
            load["inference_ms_per_pair"] = load["inference_ms_per_input"] / k
            points[k] = {"one_client_p50_ms": statistics.median(lat), "load": load}
            print(
                f"  k={k}: one client p50 {points[k]['one_client_p50_ms']:.1f} ms; "
                f"{CLIENTS} clients {load['ok_per_s']:.1f} req/s, "
                f"{load['pairs_per_s']:.1f} pairs/s",
                flush=True,
            )
    for k, times in direct(model, timed, counts).items():
        points[k]["direct_p50_ms"] = statistics.median(times)
    p50 = [points[k]["one_client_p50_ms"] for k in counts]
    return {
        "model": model,
        "task": task,
        "clients": CLIENTS,
        "points": points,
        "one_client_ms_per_label": slope(counts, p50),
        "direct_ms_per_label": slope(counts, [points[k]["direct_p50_ms"] for k in counts]),
    }


def table(result: dict[str, Any]) -> str:
    pts = result["points"]
    rows = [
        f"Zero-shot ({result['task']}, MiniLM + seeded NLI head), short inputs, k candidate "
        f"labels per request (k pairs). One client p50 (ms) beside the pipeline called directly; "
        f"{result['clients']} clients (wrk):",
        "",
        "| k | one client p50 ms | direct pipeline p50 ms | req/s | pairs/s | ms per pair | "
        "loop ms/req | inference ms/pair |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, p in sorted(pts.items(), key=lambda kv: int(kv[0])):
        load = p["load"]
        rows.append(
            f"| {k} | {common.ms(p['one_client_p50_ms'])} | {common.ms(p.get('direct_p50_ms'))} | "
            f"{load['ok_per_s']:.1f} | {load['pairs_per_s']:.1f} | "
            f"{common.ms(load['ms_per_pair'])} | {load['loop_ms_per_request']:.2f} | "
            f"{load['inference_ms_per_pair']:.2f} |"
        )
    rows += [
        "",
        f"Cost per label, one client: {result['one_client_ms_per_label']:.1f} ms "
        f"(direct pipeline {result['direct_ms_per_label']:.1f} ms; least-squares slope of p50 "
        "over k).",
    ]
    return "\n".join(rows)
