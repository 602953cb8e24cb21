"""The backends study's neighbour measures (`loadtest.experiments.backends`), by hand."""

from __future__ import annotations

import numpy as np

from loadtest.experiments.backends import distinct, neighbours_kept


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_distinct_keeps_each_texts_first_occurrence() -> None:
    assert distinct(["a", "b", "a", "c", "b", "a"]) == [0, 1, 3]
    assert distinct([]) == []


def test_copies_of_a_text_swap_neighbours_on_rounding_alone() -> None:
    """Twelve copies of one text tie at a cosine of 1: a change far below any real one
    reorders which ten make each copy's top 10, while the distinct texts keep all theirs."""
    rng = np.random.default_rng(0)
    base = unit(rng.normal(size=(20, 8)))
    texts = [f"t{i}" for i in range(20)] + ["t0"] * 11
    vectors = np.concatenate([base, np.repeat(base[:1], 11, axis=0)])
    nudged = vectors + 1e-6 * rng.normal(size=vectors.shape)
    assert neighbours_kept(vectors, vectors) == 1.0
    assert neighbours_kept(vectors, nudged) < 0.9
    once = distinct(texts)
    assert len(once) == 20
    assert neighbours_kept(vectors[once], nudged[once]) == 1.0
