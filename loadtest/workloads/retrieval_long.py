"""The retrieval workload's long-document part: one document of about 2,000 tokens on the
default model's server (LONG_INPUTS=chunk), chunked and truncated in turn.

Each request is sent alone; the server's own time for it is read from /metrics before and after
(the growth of ``pipeline_server_request_duration_seconds_sum`` for /embed: from the request's
start to its answer, the client's share left out), beside the pipeline's seconds and the inputs
the pipeline ran (a chunked document: one per window, ``service.engine.forward.windows``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadtest import corpus, servers
from loadtest.workloads import common

#: Metric samples read before and after each long-document request: (name, route label or None).
REQUEST_S = ("pipeline_server_request_duration_seconds_sum", "/embed")
REQUESTS_N = ("pipeline_server_request_duration_seconds_count", "/embed")
PIPELINE_S = ("pipeline_server_inference_seconds_sum", None)
PIPELINE_INPUTS = ("pipeline_server_batch_size_sum", None)


def document(tokens: int, tokenizer: Any) -> tuple[str, int]:
    """Consecutive corpus sentences from the first on, until the text has at least ``tokens``
    tokens (special tokens included): (the text, its token count)."""
    text = ""
    for sentence in corpus.sentences():
        text = f"{text} {sentence}".strip()
        count = len(tokenizer(text, verbose=False)["input_ids"])
        if count >= tokens:
            return text, count
    raise ValueError(f"the corpus has fewer than {tokens} tokens")


def samples(base: str) -> dict[tuple[str, str | None], float]:
    """The long-document part's metric samples (module constants) from the server's /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return parse_samples(resp.read().decode())


def parse_samples(text: str) -> dict[tuple[str, str | None], float]:
    """The module's samples (``(name, route label or None)``) in Prometheus ``text``, each
    summed over any other label; 0 when absent."""
    wanted = {REQUEST_S, REQUESTS_N, PIPELINE_S, PIPELINE_INPUTS}
    out: dict[tuple[str, str | None], float] = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("route"))
            if key in wanted:
                out[key] += s.value
    return out


def grown(base: str, before: dict[tuple[str, str | None], float]) -> dict[Any, float]:
    """How much each sample grew since ``before``, once the request's own count is in (the
    server records a request as its answer ends: read again for up to 1 s until it is)."""
    for _ in range(100):
        after = samples(base)
        if after[REQUESTS_N] > before[REQUESTS_N]:
            break
        time.sleep(0.01)
    return {key: after[key] - before[key] for key in after}


def post_json(url: str, doc: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": common.JSON})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def measure(
    srv: servers.Served, text: str, tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The long-document part (module docstring): per mode, medians over the repeats."""
    limits = (common.get_json(srv.base + "/info") or {}).get("limits", {}).get("long_inputs", {})
    bodies: dict[str, dict[str, Any]] = {
        "chunk": {"inputs": text},
        "truncate": {"inputs": text, "truncate": True},
    }
    timed: dict[str, list[dict[str, float]]] = {mode: [] for mode in bodies}
    vectors: dict[str, list[float]] = {}
    for mode, body in bodies.items():  # untimed: the first of each shape
        vectors[mode] = post_json(srv.base + "/embed", body)[0]
    for _ in range(args.retrieval_long_repeats):
        for mode, body in bodies.items():  # in turn, so both see the same machine
            before, started = samples(srv.base), time.perf_counter()
            got = post_json(srv.base + "/embed", body)[0]
            wall = time.perf_counter() - started
            grew = grown(srv.base, before)
            if grew[REQUESTS_N] != 1:
                raise RuntimeError(f"{grew[REQUESTS_N]:g} /embed requests over one: not alone")
            if cosine(got, vectors[mode]) < 0.9999:
                raise RuntimeError(f"{mode}: the same document answered a different vector")
            timed[mode].append(
                {
                    "server_ms": 1000 * grew[REQUEST_S],
                    "pipeline_ms": 1000 * grew[PIPELINE_S],
                    "pipeline_inputs": grew[PIPELINE_INPUTS],
                    "client_ms": 1000 * wall,
                }
            )
    modes: dict[str, dict[str, Any]] = {
        mode: {key: common.median(p[key] for p in points) for key in points[0]}
        for mode, points in timed.items()
    }
    for mode, points in timed.items():
        modes[mode]["server_ms_each"] = [round(p["server_ms"], 2) for p in points]
    return {
        "tokens": tokens,
        "limit": limits.get("max_input_tokens"),
        "repeats": args.retrieval_long_repeats,
        "modes": modes,
        "cosine": cosine(vectors["chunk"], vectors["truncate"]),
    }


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def table_lines(res: dict[str, Any]) -> list[str]:
    lines = [
        f"A {res['tokens']:,}-token document on the default model (limit {res['limit']} "
        f"tokens), one request at a time, medians of {res['repeats']}:",
        "",
        "| mode | server ms per request | pipeline ms | pipeline inputs (windows) | client ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode, m in res["modes"].items():
        lines.append(
            f"| {mode} | {common.ms(m['server_ms'])} | {common.ms(m['pipeline_ms'])} "
            f"| {m['pipeline_inputs']:.0f} | {common.ms(m['client_ms'])} |"
        )
    chunk, cut = res["modes"]["chunk"]["server_ms"], res["modes"]["truncate"]["server_ms"]
    lines += [
        "",
        f"- chunked / truncated server time: {chunk / cut:.1f}x; cosine(chunked, truncated) "
        f"= {res['cosine']:.4f}",
        "",
    ]
    return lines
