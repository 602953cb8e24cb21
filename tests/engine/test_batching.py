"""Answers under batching equal direct single pipeline calls, for every task, and batches form.

Concurrent requests of mixed lengths share batches (MAX_BATCH_WAIT_MS gives them a window);
each answer is compared with `pipeline(task, model=...)(text)` called alone. Scores and vectors
must agree within 1e-4 (CASES.md); tiny random models have near-ties, so scores are compared,
not only the order of labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import app_client, assert_close, batch_sizes, post_concurrently

TEXTS = [
    "Paris is the [MASK] of France.",
    "[MASK]",
    "John lives in London and works at Acme on Monday, a [MASK] day.",
    "Hello [MASK] world",
    "This is an example sentence with some more words and more text, " * 6 + "[MASK].",
    "Berlin is a big city in Germany; Rome is a [MASK] city in Italy.",
    "a [MASK] b",
    "The river is [MASK] and the city is small, happy, sad, good, bad.",
]


def _comparable(task: str, answer: Any) -> Any:
    """Tiny random models have near-ties: for ranked answers compare scores by label/token."""
    if task == "fill-mask":
        return sorted((round(x["score"], 4), x["token"]) for x in answer)[-3:]
    if task == "text-classification":
        return {x["label"]: x["score"] for x in answer} if isinstance(answer, list) else answer
    return answer


@pytest.mark.parametrize(
    "task, params",
    [
        ("fill-mask", {}),
        ("fill-mask", {"top_k": 3}),
        ("text-classification", {"top_k": 3}),
        ("text-classification", {}),
        ("token-classification", {}),
        ("token-classification", {"aggregation_strategy": "simple"}),
    ],
)
def test_batched_answers_equal_single_calls(
    tiny_models: dict[str, Path], task: str, params: dict[str, Any]
) -> None:
    from transformers import pipeline

    texts = TEXTS if task == "fill-mask" else [t.replace("[MASK]", "capital") for t in TEXTS]
    direct = pipeline(task, model=str(tiny_models[task]))
    before = batch_sizes()[0]
    with app_client(tiny_models[task], max_batch_wait_ms=100) as client:
        bodies = [{"inputs": t, "parameters": params} for t in texts]
        answers = post_concurrently(client, bodies)
    assert batch_sizes()[0] > before, "no batch larger than 1 formed"
    for text, answer in zip(texts, answers, strict=True):
        if task == "text-classification":  # one list of labels per input; all unless top_k
            answer, params = answer[0], {"top_k": params.get("top_k")}
        expected = direct(text, **params)
        if task == "fill-mask" or task == "text-classification":
            assert_close(_comparable(task, answer), _comparable(task, expected))
        else:
            assert_close(answer, _json_ready(expected))


def test_feature_extraction_batched_equals_single(embedded_model: Path) -> None:
    """Sentence embeddings under batching equal sentence-transformers' own encode."""
    from sentence_transformers import SentenceTransformer

    texts = [t.replace("[MASK]", "capital") for t in TEXTS]
    reference = SentenceTransformer(str(embedded_model), device="cpu").encode(texts)
    before = batch_sizes()[0]
    with app_client(embedded_model, max_batch_wait_ms=100) as client:
        answers = post_concurrently(client, [{"inputs": t} for t in texts])
        listed = client.post("/", json={"inputs": texts}).json()
    assert batch_sizes()[0] > before
    for answer, in_list, expected in zip(answers, listed, reference, strict=True):
        assert np.asarray(answer).shape == (1, 384)  # one input: a 1 x 384 matrix
        assert np.abs(np.asarray(answer)[0] - expected).max() < 1e-4
        assert np.abs(np.asarray(in_list) - expected).max() < 1e-4  # list order kept


def test_token_rows_batched_equal_single_pipeline_calls(embedded_model: Path) -> None:
    """POOLING=none: each input's own token rows (padding cut off), as the pipeline answers."""
    from transformers import pipeline

    texts = [t.replace("[MASK]", "capital") for t in TEXTS]
    direct = pipeline("feature-extraction", model=str(embedded_model))
    before = batch_sizes()[0]
    with app_client(embedded_model, max_batch_wait_ms=100, pooling="none") as client:
        answers = post_concurrently(client, [{"inputs": t} for t in texts])
        listed = client.post("/", json={"inputs": texts}).json()
    assert batch_sizes()[0] > before
    for text, answer, in_list in zip(texts, answers, listed, strict=True):
        expected = np.asarray(direct(text))
        got = np.asarray(answer)
        assert got.shape == expected.shape  # [1, tokens, 384]
        assert np.abs(got - expected).max() < 1e-4
        assert np.abs(np.asarray(in_list) - expected).max() < 1e-4  # list order kept


def _json_ready(value: Any) -> Any:
    """Direct pipeline answers hold numpy scalars; the server's JSON holds plain numbers."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
