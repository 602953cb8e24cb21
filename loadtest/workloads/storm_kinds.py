"""The storms of ``loadtest.workloads.storm``: what the clients send, how many
connections carry it, closed or open loop; and the probes and metrics watched beside each.

| kind | clients | requests |
| --- | --- | --- |
| ``same`` | 256 wrk connections, resending at once on 503 | one 3-sentence input, always |
| ``differing`` | the same | one corpus sentence each, never twice in a row |
| ``differing2`` | the same | two corpus sentences each (a list of two inputs) |
| ``pooled`` | 64 wrk connections (a proxy's pool), back to back | two sentences each |
| ``open4x`` | open loop (``rawhttp``), 4x the polite capacity (config A's) | one sentence |

A proxy's pool is a storm only when its requests hold more inputs than the queue: 64
connections of two inputs each (128) against ``MAX_QUEUE_SIZE=64``. Inputs are word windows of
the corpus outside the ``same`` body (:func:`held_out_texts`). Capacity is measured per body set.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtest import client, corpus, rawhttp, servers, wrk
from loadtest.stats import latency_summary
from loadtest.workloads import common


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    bodies: str  # the body set: "same", "differing" or "differing2"
    connections: int = 0  # wrk connections; 0: open loop
    open_factor: float = 0.0  # open loop: arrivals/s as a multiple of the polite capacity


KINDS: tuple[Kind, ...] = (
    Kind("same", "same", 256),
    Kind("differing", "differing", 256),
    Kind("differing2", "differing2", 256),
    Kind("pooled", "differing2", 64),
    Kind("open4x", "differing", open_factor=4.0),
)
BODY_COUNT = 2000
OPEN_MAX_IN_FLIGHT = 512  # arrivals beyond are counted as dropped (open loop)
PROBE_PATHS = ("/livez", "/readyz", "/metrics")
# Counters read from /metrics before and after each storm: which mechanism acted.
WATCHED = {
    "pipeline_server_shed_total": "sheds",
    "pipeline_server_shed_held_total": "held",
    "pipeline_server_shed_cpu_seconds_total": "shed_cpu_s",
    "pipeline_server_http_refused_total": "refused",
    # what the model did with it: batches, their inputs and padded tokens, pipeline seconds
    "pipeline_server_batch_size_count": "batches",
    "pipeline_server_batch_size_sum": "batch_inputs",
    "pipeline_server_batch_padded_tokens_sum": "padded_tokens",
    "pipeline_server_inference_seconds_sum": "inference_s",
}


def held_out_texts(first_storm_sentence: str, n: int = BODY_COUNT) -> list[str]:
    """``n`` different inputs: word windows (4-40 words, never past a sentence's end) of the
    corpus's sentences outside the three of the ``same`` body, drawn with seed 0: thousands of
    distinct inputs of varying length, as documents of an indexing job would be."""
    sents = corpus.sentences()
    start = sents.index(first_storm_sentence)
    words = [s.split() for i, s in enumerate(sents) if not start <= i < start + 3]
    words = [w for w in words if len(w) >= 4]
    rng, out, seen = random.Random(0), list[str](), set[str]()
    while len(out) < n:
        sent = rng.choice(words)
        size = rng.randint(4, min(40, len(sent)))
        at = rng.randint(0, len(sent) - size)
        text = " ".join(sent[at : at + size])
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def body_sets(same_input: str) -> dict[str, list[bytes]]:
    """Each body set: JSON bodies of the HF Inference API shape, one per line for wrk."""
    texts = held_out_texts(same_input.split(". ")[0] + ".", 2 * BODY_COUNT)
    ones, twos = texts[:BODY_COUNT], texts[BODY_COUNT:]
    return {
        "same": [common.json_body(same_input)],
        "differing": [common.json_body(t) for t in ones],
        "differing2": [
            json.dumps({"inputs": [a, b]}).encode() for a, b in zip(ones, twos, strict=True)
        ],
    }


async def open_loop(
    srv: servers.Served, bodies: list[bytes], rate_per_s: float, seconds: float
) -> dict[str, Any]:
    """Arrivals at ``rate_per_s`` whatever the answers do; 200s/s. The raw client
    (``rawhttp.open_loop``): aiohttp's costs the shared cores several times as much."""
    reqs = [client.Request("POST", "/", b, (("Content-Type", common.JSON),)) for b in bodies]
    result = await rawhttp.open_loop(srv.base, reqs, rate_per_s, seconds, OPEN_MAX_IN_FLIGHT)
    summary = result.summary()
    statuses = result.statuses()
    return {
        "rate_per_s": rate_per_s,
        "requests": summary["requests"],
        "ok_per_s": summary["requests_per_s"],
        "statuses": statuses,
        "shed_per_s": statuses.get(503, 0) / seconds,
        "expired_per_s": statuses.get(504, 0) / seconds,
        "dropped": result.dropped,
        "p50_ms": summary["p50_ms"],
    }


def closed_loop(
    srv: servers.Served, bodies: list[bytes], kind: Kind, seconds: float
) -> dict[str, Any]:
    """wrk: ``kind.connections`` connections, the next request the moment an answer arrives."""
    run = wrk.run(srv.base + "/", bodies, kind.connections, seconds, count_statuses=True)
    res = run.summary()
    res["shed_per_s"], res["expired_per_s"] = run.per_s(503), run.per_s(504)
    return res


async def probes(base: str, stop: asyncio.Event, out: list[tuple[str, int, float]]) -> None:
    """The kubelet's way: a fresh connection per probe, every 100 ms, /livez, /readyz and
    /metrics in turn, 2 s timeout each; appends (path, status, seconds); status 0: no answer."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=timeout
    ) as http:
        k = 0
        while not stop.is_set() and len(out) < 10_000:
            path = PROBE_PATHS[k % len(PROBE_PATHS)]
            k += 1
            sent = time.perf_counter()
            try:
                async with http.get(base + path) as resp:
                    await resp.read()
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            out.append((path, status, time.perf_counter() - sent))
            await asyncio.sleep(0.1)


def probe_summary(answers: list[tuple[str, int, float]]) -> dict[str, Any]:
    ok = [s for _, status, s in answers if status == 200]
    lat = latency_summary(ok)
    return {
        "sent": len(answers),
        "failed": len(answers) - len(ok),
        "p50_ms": lat["p50_ms"],
        "max_ms": 1000 * max(ok) if ok else float("nan"),
    }


def batching(acted: dict[str, float]) -> dict[str, float]:
    """What the model did over a window, from the ``WATCHED`` counters' differences: the mean
    batch (inputs), padded tokens per input, and pipeline ms per input (the inference
    thread's wall time in the pipeline over the inputs it answered). Empty without batches.
    A storm whose pipeline ms per input is well above its capacity run's lost its speed in
    the model (smaller batches, more padding, or a slower machine), not at the edge."""
    batches, inputs = acted.get("batches", 0.0), acted.get("batch_inputs", 0.0)
    if batches <= 0 or inputs <= 0:
        return {}
    return {
        "mean_batch": inputs / batches,
        "padded_tokens_per_input": acted.get("padded_tokens", 0.0) / inputs,
        "pipeline_ms_per_input": 1000 * acted.get("inference_s", 0.0) / inputs,
    }


def counters(base: str) -> dict[str, float]:
    """The ``WATCHED`` counters, summed over their labels ({} if /metrics cannot be read)."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            short = WATCHED.get(sample.name)
            if short is not None:
                out[short] = out.get(short, 0.0) + sample.value
    return out
