"""The benchmark's workloads, one module each; ``loadtest.bench`` runs them in this order.

| name | what it measures |
| --- | --- |
| ``mixed`` | the mixed-input bench: limit, closed levels, paired rounds, overload, seed baseline |
| ``short_inputs`` | short inputs (embeddings, classification): wrk levels, paired with limit (b) |
| ``storm`` | retry storms (256 clients resending on 503): goodput against capacity, A/B |
| ``cost`` | CPU per answered input against the backend's in process; one client's CPU, p50 |
| ``retrieval`` | multi-vector answers, rerankers (cross-encoder, MaxSim), a long input chunked |
| ``token-pooling`` | multi-vector token pooling: bytes per document, MaxSim ranking agreement |
| ``bulk`` | interactive one-input latency alone and beside a bulk indexer (1,000-input requests) |
| ``hybrid`` | a BGE-M3 folder's dense + sparse + multi-vector in one call against three calls |
| ``static`` | a static embedding model beside the default model: short inputs/s, CPU per input |
| ``late-chunking`` | late chunking (one request a document) against chunking first (one a chunk) |

Each module has ``add_arguments(parser)``, ``finish_arguments(args, results)``, ``run(args)``
(returns a JSON-friendly dict) and ``table(result)`` (Markdown). Studies built the same way
(CPU per request, profile, burst, memory, zero-shot, pooled answers) are in
``loadtest.experiments``.
"""

from __future__ import annotations

from types import ModuleType

from loadtest.workloads import (
    bulk,
    cost,
    hybrid,
    late_chunking,
    mixed,
    retrieval,
    short_inputs,
    static,
    storm,
    token_pooling,
)

WORKLOADS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (
        mixed,
        short_inputs,
        storm,
        cost,
        retrieval,
        token_pooling,
        bulk,
        hybrid,
        static,
        late_chunking,
    )
}
