"""32 concurrent requests with different settings share batches; each gets its own answer,
equal to the same request sent alone.

Different normalize, dimensions, truncation and prompts (and similarity requests) on the
embedded model; different label sets, templates and multi_label on a zero-shot model. The
batch window (MAX_BATCH_WAIT_MS) makes them meet in batches; the batch-size histogram shows
that they did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from helpers import app_client, assert_close, batch_sizes, post_concurrently

WORDS = "the river runs past the old city and the big bridge on a sunny monday".split()  # noqa: SIM905


def _texts(n: int) -> list[str]:
    return [" ".join(WORDS[: 3 + (i * 5) % len(WORDS)]) + f" {i}" for i in range(n)]


def _embedding_body(i: int, text: str) -> dict[str, Any]:
    kind = i % 8
    if kind == 0:
        return {"inputs": text}
    if kind == 1:
        return {"inputs": text, "normalize": False}
    if kind == 2:
        return {"inputs": [text, text + " again"], "dimensions": 64}
    if kind == 3:
        return {"inputs": text, "dimensions": 128, "normalize": False}
    if kind == 4:
        return {"inputs": text * 40, "truncate": True, "truncation_direction": "left"}
    if kind == 5:
        return {"inputs": text, "prompt_name": "query"}
    if kind == 6:
        return {"inputs": {"source_sentence": text, "sentences": [text[::-1], "a bridge"]}}
    return {"inputs": text * 40, "truncate": True}


def test_mixed_embedding_requests_each_get_their_own_answer(embedded_model: Path) -> None:
    bodies = [_embedding_body(i, t) for i, t in enumerate(_texts(32))]
    with app_client(embedded_model, max_batch_wait_ms=50) as client:
        alone = [client.post("/", json=b).json() for b in bodies]
        before = batch_sizes()[1]
        together = post_concurrently(client, bodies)
        assert batch_sizes()[1] - before >= 16  # most of them ran in shared batches
    for body, single, mixed in zip(bodies, alone, together, strict=True):
        assert_close(mixed, single)
        if body.get("dimensions"):
            assert np.asarray(mixed).shape[-1] == body["dimensions"]


def test_mixed_zero_shot_requests_each_get_their_own_answer(
    tiny_models: dict[str, Path],
) -> None:
    label_sets = [["city", "river"], ["good", "bad", "sad"], ["monday"], ["a", "b", "c", "d"]]
    bodies = []
    for i, text in enumerate(_texts(32)):
        parameters: dict[str, Any] = {"candidate_labels": label_sets[i % 4]}
        if i % 3 == 1:
            parameters["multi_label"] = True
        if i % 5 == 2:
            parameters["hypothesis_template"] = "It is about {}."
        bodies.append({"inputs": text, "parameters": parameters})
    with app_client(tiny_models["zero-shot-classification"], max_batch_wait_ms=50) as client:
        alone = [client.post("/", json=b).json() for b in bodies]
        before = batch_sizes()[1]
        together = post_concurrently(client, bodies)
        assert batch_sizes()[1] - before >= 32  # label pairs of different requests met
    for body, single, mixed in zip(bodies, alone, together, strict=True):
        assert [x["label"] for x in mixed] and len(mixed) == len(
            body["parameters"]["candidate_labels"]
        )
        assert_close(mixed, single)
