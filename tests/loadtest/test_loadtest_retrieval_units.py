"""The retrieval workload's parts without a subprocess server: its options, inputs, the metric
readings of the long-document part, its tables, and its bench models served in process."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import app_client
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from loadtest import corpus, models
from loadtest.bench import parse_args
from loadtest.workloads import retrieval, retrieval_long


def test_options_and_their_quick_defaults() -> None:
    quick = parse_args(["--only", "retrieval", "--quick"])
    assert quick.retrieval_levels == [1, 16] and quick.retrieval_rerank_levels == [1, 4]
    assert quick.retrieval_seconds == 2.0 and quick.retrieval_inputs == 64
    assert quick.retrieval_long_repeats == 3 and quick.retrieval_long_tokens == 2000
    assert quick.retrieval_parts == ["embeddings", "rerank", "long"]
    full = parse_args(["--only", "retrieval", "--retrieval-levels", "1,4,32"])
    assert full.retrieval_levels == [1, 4, 32] and full.retrieval_seconds == 8.0
    assert full.retrieval_inputs == 256 and full.retrieval_long_repeats == 7
    parts = parse_args(["--only", "retrieval", "--retrieval-parts", "long"])
    assert parts.retrieval_parts == ["long"]
    with pytest.raises(SystemExit, match="unknown nope"):
        parse_args(["--only", "retrieval", "--retrieval-parts", "long,nope"])


def test_queries_and_documents_are_seeded_and_within_their_words() -> None:
    queries = retrieval.texts(50, retrieval.QUERY_WORDS, seed=1)
    documents = retrieval.texts(50, retrieval.DOCUMENT_WORDS, seed=2)
    assert queries == retrieval.texts(50, retrieval.QUERY_WORDS, seed=1) != documents
    assert all(len(q.split()) <= 25 for q in queries)
    assert all(len(d.split()) <= 150 for d in documents)
    assert sum(len(d.split()) >= 40 for d in documents) > 45  # at the corpus's end: shorter


def test_the_long_document_has_just_over_its_tokens() -> None:
    tok = corpus._default_tokenizer()
    text, count = retrieval_long.document(2000, tok)
    sentences = corpus.sentences()
    n = next(n for n in range(len(sentences)) if " ".join(sentences[:n]) == text)
    assert count == len(tok(text, verbose=False)["input_ids"]) >= 2000
    assert len(tok(" ".join(sentences[: n - 1]))["input_ids"]) < 2000  # a sentence less: short
    with pytest.raises(ValueError, match="fewer than"):
        retrieval_long.document(10**7, tok)


def test_metric_samples_are_read_by_route_and_summed_over_other_labels() -> None:
    registry = CollectorRegistry()
    seconds = Histogram(
        "pipeline_server_request_duration_seconds", "", ["route"], registry=registry
    )
    batch = Histogram("pipeline_server_batch_size", "", registry=registry)
    seconds.labels("/embed").observe(0.25)
    seconds.labels("/embed").observe(0.5)
    seconds.labels("/rerank").observe(9.0)
    batch.observe(8)
    batch.observe(1)
    got = retrieval_long.parse_samples(generate_latest(registry).decode())
    assert got[retrieval_long.REQUEST_S] == 0.75 and got[retrieval_long.REQUESTS_N] == 2
    assert got[retrieval_long.PIPELINE_INPUTS] == 9
    assert got[retrieval_long.PIPELINE_S] == 0  # not exported: nothing grew


def test_answers_are_weighed_and_their_vectors_counted() -> None:
    pooled = json.dumps([[0.5, -0.25, 0.125]]).encode()
    multi = [json.dumps([[[0.1, 0.2]] * n]).encode() for n in (3, 5)]
    assert retrieval.weigh([pooled]) == {"bytes_per_answer": len(pooled), "vectors_per_input": 1}
    got = retrieval.weigh(multi)
    assert got["vectors_per_input"] == 4 and got["bytes_per_answer"] == sum(map(len, multi)) / 2
    assert retrieval_long.cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(math.sqrt(0.5))


def _point(inputs_per_s: float, requests_per_s: float, **statuses: int) -> dict[str, Any]:
    return {
        "inputs_per_s": inputs_per_s,
        "requests_per_s": requests_per_s,
        "p50_ms": 12.5,
        "p95_ms": 40.0,
        "statuses": statuses or {"200": 10},
    }


def test_tables_after_a_json_round_trip() -> None:
    def side(backend: str, dim: int, size: float, vectors: float) -> dict[str, Any]:
        part = {"bytes_per_answer": size, "vectors_per_input": vectors}
        levels = {1: _point(50.0, 50.0), 16: _point(80.0, 80.0)}
        return {
            "backend": backend,
            "dimension": dim,
            "query": {**part, "levels": levels},
            "document": {**part, "levels": levels},
        }

    result = {
        "inputs": {
            "query": {"n": 64, "tokens_mean": 21.4, "tokens_max": 40},
            "document": {"n": 64, "tokens_mean": 128.2, "tokens_max": 210},
        },
        "docs_per_query": 16,
        "embeddings": {
            "pooled": side("torch float32", 384, 4690.0, 1.0),
            "multi-vector": side("torch float32", 128, 207097.4, 135.0),
        },
        "rerank": {
            "cross-encoder": {
                "backend": "torch float32",
                "scoring": "sigmoid",
                "levels": {8: _point(64.0, 4.0, **{"200": 30, "503": 2})},
            },
        },
        "long": {
            "tokens": 2032,
            "limit": 256,
            "repeats": 3,
            "modes": {
                "chunk": {
                    "server_ms": 120.0,
                    "pipeline_ms": 100.0,
                    "pipeline_inputs": 8.0,
                    "client_ms": 121.5,
                },
                "truncate": {
                    "server_ms": 20.0,
                    "pipeline_ms": 15.0,
                    "pipeline_inputs": 1.0,
                    "client_ms": 21.0,
                },
            },
            "cosine": 0.73961,
        },
    }
    text = retrieval.table(json.loads(json.dumps(result)))
    assert "queries 21 tokens mean (max 40), documents 128 (max 210), 64 of each" in text
    assert (
        "| multi-vector (128 floats) | /embed_multi | torch float32 | document | 16 | 80.0 "
        "| 12.5 | 40.0 | 207,097 | 135.0 | 0 |" in text
    )
    assert "| pooled (384 floats) | /embed | torch float32 | query | 1 | 50.0 |" in text
    assert "| cross-encoder | torch float32 | sigmoid | 8 | 4.00 | 64.0 | 12.5 | 40.0 | 2 |" in text
    assert "| chunk | 120.0 | 100.0 | 8 | 121.5 |" in text
    assert "A 2,032-token document on the default model (limit 256 tokens)" in text
    assert "server time: 6.0x; cosine(chunked, truncated) = 0.7396" in text
    only_long = retrieval.table({**result, "embeddings": {}, "rerank": {}})
    assert "/embed" not in only_long and "| truncate | 20.0 |" in only_long


def test_bench_models_are_served_as_sentence_transformers_scores_them(tmp_path: Path) -> None:
    """The multi-vector model's token vectors and MaxSim order, and the cross-encoder's scores,
    from the in-process app against sentence-transformers' own classes; built once each."""
    from sentence_transformers import CrossEncoder, MultiVectorEncoder

    query, docs = "Who wrote the letter?", ["The letter was written by him.", "It rained."]
    folder = models.minilm_multi_vector(tmp_path / "mv")
    weights = folder / "model.safetensors"
    built = weights.stat().st_mtime_ns
    assert models.minilm_multi_vector(tmp_path / "mv") == folder
    assert weights.stat().st_mtime_ns == built  # the recipe matched: not built again
    encoder = MultiVectorEncoder(str(folder), device="cpu")
    assert [type(m).__name__ for m in encoder] == [
        "Transformer",
        "Dense",
        "MultiVectorMask",
        "Normalize",
    ]
    expected = encoder.encode_document(docs)
    scores = encoder.similarity(encoder.encode_query([query]), expected)[0].tolist()
    with app_client(folder) as client:
        got = client.post("/embed_multi", json={"inputs": docs, "input_type": "document"})
        ranked = client.post("/rerank", json={"query": query, "texts": docs}).json()
    for g, e in zip(got.json(), expected, strict=True):
        assert np.abs(np.asarray(g) - e.numpy()).max() <= 1e-4 and len(g[0]) == 128
    assert [r["index"] for r in ranked] == sorted(range(2), key=lambda i: -scores[i])
    assert [r["score"] for r in ranked] == pytest.approx(sorted(scores, reverse=True), abs=1e-3)

    folder = models.minilm_cross_encoder(tmp_path / "ce")
    predicted = CrossEncoder(str(folder), device="cpu").predict([(query, d) for d in docs])
    with app_client(folder) as client:
        ranked = client.post("/rerank", json={"query": query, "texts": docs}).json()
    assert {r["index"]: r["score"] for r in ranked} == pytest.approx(
        dict(enumerate(predicted.tolist())), abs=1e-4
    )
