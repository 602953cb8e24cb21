"""The int8 study's measures (`loadtest.experiments.int8_quality`) against scipy's and by hand."""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from loadtest.experiments.int8_quality import ranks, spearman, top_k_kept


def test_spearman_equals_scipys_with_ties() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=200)
    b = np.round(a + rng.normal(scale=0.5, size=200))  # many ties, as int codes have
    assert list(ranks(np.array([3.0, 1.0, 3.0, 2.0]))) == [2.5, 0.0, 2.5, 1.0]
    assert abs(spearman(a, b) - spearmanr(a, b).statistic) < 1e-12


def test_top_k_kept_counts_shared_neighbours() -> None:
    x = np.random.default_rng(1).normal(size=(12, 4))
    sims = x @ x.T
    assert top_k_kept(sims, sims, k=3) == 1.0
    # reversed: each row's 3 nearest become its 3 farthest of 11, none shared
    assert top_k_kept(sims, -sims, k=3) == 0.0
    assert top_k_kept(sims, sims + 1e-9 * np.eye(12), k=3) == 1.0  # its own score left out
