"""`auto` checks every output kind the engine serves (service.engine.loading.choice.quality): each
bound on real tensors, a candidate moved just inside and just outside it; and a tiny SPLADE
folder whose bfloat16 candidate loses top indices is served float32 under `auto`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_models import splade_model
from helpers import captured_logs

from service.engine.jobs import Op, Unit
from service.engine.loading.choice import backend_choice, candidates, quality
from service.engine.loading.choice.quality import (
    MAX_DOT_DIFF,
    MAX_PROB_DIFF,
    MAX_SCORE_DIFF,
    MIN_COSINE,
    MIN_ROW_COSINE,
    SPARSE_TIE,
    TIE,
    TOP_K,
    Quality,
    classifier_quality,
    rows_quality,
    sparse_quality,
    vector_quality,
)
from service.engine.loading.load import load_engine
from service.settings import Settings

MARGIN = 1e-5  # how far inside or outside a bound each candidate is moved


def turned(x: torch.Tensor, cosine: float, seed: int = 0) -> torch.Tensor:
    """`x` [..., D] turned (norm kept) to exactly `cosine` with itself, in float64."""
    x = x.double()
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    unit = x / x.norm(dim=-1, keepdim=True)
    orth = noise - (noise * unit).sum(-1, keepdim=True) * unit
    orth = orth / orth.norm(dim=-1, keepdim=True) * x.norm(dim=-1, keepdim=True)
    return cosine * x + math.sqrt(1 - cosine**2) * orth


def test_pooled_vectors_keep_a_cosine_of_min_cosine() -> None:
    ref = torch.randn(4, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    inside, outside = ref.clone(), ref.clone()
    inside[2] = turned(ref[2], MIN_COSINE + MARGIN)
    outside[2] = turned(ref[2], MIN_COSINE - MARGIN)
    assert vector_quality(ref, inside).min_cosine == pytest.approx(MIN_COSINE + MARGIN)
    assert vector_quality(ref, inside).passes()
    failed = vector_quality(ref, outside)
    assert not failed.passes() and failed.failed() == ("min_cosine",)


def test_token_rows_keep_a_cosine_of_min_row_cosine_on_real_tokens_only() -> None:
    ref = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    inside, outside = ref.clone(), ref.clone()
    inside[1, 2] = turned(ref[1, 2], MIN_ROW_COSINE + MARGIN)
    outside[1, 2] = turned(ref[1, 2], MIN_ROW_COSINE - MARGIN)
    for out in (inside, outside):
        out[1, 3:] = 0.0  # pad rows, as a packed backend leaves them: not served
        out[2, 2:] = -ref[2, 2:]
    assert rows_quality(ref, inside, mask).min_row_cosine == pytest.approx(MIN_ROW_COSINE + MARGIN)
    assert rows_quality(ref, inside, mask).passes()
    assert rows_quality(ref, outside, mask).failed() == ("min_row_cosine",)
    nan = inside.clone()
    nan[0, 0, 0] = float("nan")
    assert rows_quality(ref, nan, mask).failed() == ("finite",)


def splade_like(texts: int = 4, vocab: int = 200, seed: int = 3) -> torch.Tensor:
    """SPLADE-like weights [B, V]: about 60 nonzero (log1p of relu) per text, all distinct."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(texts, vocab, generator=generator, dtype=torch.float64) - 0.5
    return logits.relu().log1p()


def swap(w: torch.Tensor, row: int, a: int, b: int) -> torch.Tensor:
    """`w` with row `row`'s a-th and b-th largest weights exchanged (the same values, on each
    other's vocabulary index)."""
    out = w.clone()
    order = w[row].argsort(descending=True)
    i, j = order[a], order[b]
    out[row, i], out[row, j] = w[row, j], w[row, i]
    return out


def test_sparse_top_k_indices_are_kept_unless_a_near_tie_at_the_kth() -> None:
    ref = splade_like()
    assert int((ref > 0).sum(-1).min()) > TOP_K
    assert sparse_quality(ref, ref) == Quality(finite=True, top_k_recall=1.0, max_dot_diff=0.0)
    # float32's 32nd and 33rd swapped: one of its top-32 lost
    lost = sparse_quality(ref, swap(ref, 1, TOP_K - 1, TOP_K))
    assert lost.top_k_recall == pytest.approx(1 - 1 / TOP_K) and "top_k_recall" in lost.failed()
    # the same swap where the two weights are a near tie (within SPARSE_TIE of the largest)
    tied = ref.clone()
    order = ref[1].argsort(descending=True)
    largest, outside = float(ref[1, order[0]]), float(ref[1, order[TOP_K]])
    tied[1, order[TOP_K - 1]] = outside + SPARSE_TIE * largest - MARGIN
    assert sparse_quality(tied, swap(tied, 1, TOP_K - 1, TOP_K)).top_k_recall == 1.0
    # ... and one just outside the tie: lost
    tied[1, order[TOP_K - 1]] = outside + SPARSE_TIE * largest + MARGIN
    assert sparse_quality(tied, swap(tied, 1, TOP_K - 1, TOP_K)).top_k_recall < 1.0
    # a swap inside the top-32 keeps the set (its dot products move: that check sees it)
    assert sparse_quality(ref, swap(ref, 1, 0, 5)).top_k_recall == 1.0


def test_a_text_with_fewer_nonzero_weights_than_k_keeps_them_all() -> None:
    ref = torch.zeros(1, 100, dtype=torch.float64)
    ref[0, [3, 50, 70]] = torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64)
    moved = ref.clone()
    moved[0, 70], moved[0, 71] = 0.0, 0.3  # one of its three indices lost
    assert sparse_quality(ref, moved).top_k_recall == pytest.approx(2 / 3)
    assert sparse_quality(ref, ref * 1.0001).top_k_recall == 1.0


def test_sparse_dot_products_within_max_dot_diff() -> None:
    """Row 0 scaled by (1 + e): its dot product with itself moves by 2e + e^2 of its norm
    squared (with the others by e), and no index moves."""
    ref = splade_like()

    def scaled(diff: float) -> torch.Tensor:
        out = ref.clone()
        out[0] *= math.sqrt(1 + diff)  # (1 + e)^2 - 1 = diff
        return out

    inside, outside = (
        sparse_quality(ref, scaled(MAX_DOT_DIFF - MARGIN)),
        sparse_quality(ref, scaled(MAX_DOT_DIFF + MARGIN)),
    )
    assert inside.max_dot_diff == pytest.approx(MAX_DOT_DIFF - MARGIN)
    assert inside.passes() and inside.top_k_recall == 1.0
    assert outside.failed() == ("max_dot_diff",)


def two_class_logits(p: torch.Tensor) -> torch.Tensor:
    """Logits [B, 2] whose softmax's first column is `p` [B]."""
    return torch.stack([torch.log(p / (1 - p)), torch.zeros_like(p)], dim=-1)


def test_classifier_probabilities_within_max_prob_diff_and_clear_top_labels_kept() -> None:
    p = torch.tensor([0.9, 0.3, 0.5005], dtype=torch.float64)  # the last a near tie
    ref = two_class_logits(p)
    inside = classifier_quality(ref, two_class_logits(p - (MAX_PROB_DIFF - MARGIN)))
    assert inside.max_prob_diff == pytest.approx(MAX_PROB_DIFF - MARGIN, rel=1e-4)
    assert inside.passes() and inside.top_label_kept
    outside = classifier_quality(ref, two_class_logits(p - (MAX_PROB_DIFF + MARGIN)))
    assert outside.failed() == ("max_prob_diff",)  # the near tie flipped: allowed
    assert outside.top_label_kept
    flipped = classifier_quality(ref, two_class_logits(torch.tensor([0.9, 0.3, 0.4996])))
    assert flipped.passes()
    clear = ref.clone()
    clear[0] = ref[0].flip(-1)  # a clear label flipped (0.9 -> 0.1)
    assert classifier_quality(ref, clear).failed() == ("max_prob_diff", "top_label_kept")


@pytest.mark.parametrize(("activation", "scale"), [("sigmoid", 1.0), ("identity", 6.0)])
def test_reranker_scores_within_max_score_diff_and_their_order_kept(
    activation: str, scale: float
) -> None:
    """The served score (sigmoid of the logit; identity: the logit, whose bound is relative
    to the largest score's magnitude, 6 here) just inside and outside the bound."""
    logits = torch.tensor([[2.0], [-1.0], [0.5], [6.0 if activation == "identity" else 0.0]])
    score = quality.ACTIVATIONS[activation](logits.double())

    def moved(diff: float) -> torch.Tensor:
        target = score.clone()
        target[1] += diff * scale
        return target if activation == "identity" else torch.logit(target)

    inside = classifier_quality(logits, moved(MAX_SCORE_DIFF - MARGIN), activation)
    assert inside.max_score_diff == pytest.approx(MAX_SCORE_DIFF - MARGIN, rel=1e-6)
    assert inside.passes() and inside.score_order_kept
    outside = classifier_quality(logits, moved(MAX_SCORE_DIFF + MARGIN), activation)
    assert outside.failed() == ("max_score_diff",)
    # two texts within TIE may swap; two further apart may not
    near = torch.tensor([[0.0], [TIE / 2]])
    assert classifier_quality(near, near.flip(0), "identity").score_order_kept
    far = torch.tensor([[0.0], [3 * TIE]])
    assert classifier_quality(far, far.flip(0), "identity").failed() == (
        "max_score_diff",
        "score_order_kept",
    )


def test_info_states_each_check_and_its_bound() -> None:
    assert quality.bounds(("top_k_recall", "max_dot_diff", "score_order_kept")) == {
        "top_k_recall": ">= 1",
        "max_dot_diff": "<= 0.001",
        "score_order_kept": "true",
    }
    measured = Quality(finite=True, min_cosine=0.9999, min_row_cosine=0.998)
    assert measured.checks() == ("min_cosine", "min_row_cosine")
    assert measured.summary() == {
        "finite": True,
        "passes": False,
        "min_cosine": 0.9999,
        "min_row_cosine": 0.998,
        "failed": ["min_row_cosine"],
    }


# -- a tiny SPLADE folder under `auto` ------------------------------------------------------

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Water boils at 100 degrees Celsius at sea level.",
]


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return splade_model(tmp_path_factory.mktemp("checks") / "splade")


def sparse_answers(engine: Any) -> list[Any]:
    return engine.run([engine.prepare(Unit(op=Op.SPARSE, text=t)) for t in TEXTS])


def test_a_splade_model_whose_bfloat16_loses_top_indices_is_served_float32(
    splade: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bfloat16 is a candidate on every CPU here (`native_bf16` forced: where torch emulates
    it, it is only slower). Its pooled-logits cosine would pass; its SPLADE weights lose
    top-32 indices and move dot products, so `auto` serves float32, and says why."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(candidates, "native_bf16", lambda: True)
    with captured_logs(candidates) as logs:
        chosen = load_engine(Settings(model_id=str(splade), backend="auto", dtype="auto"))
    backend = chosen.info.summary()["backend"]
    assert backend["checks"] == {"top_k_recall": ">= 1", "max_dot_diff": "<= 0.001"}
    rows = {(r["backend"], r["dtype"]): r["quality"] for r in backend["candidates"]}
    assert set(rows) == {("torch", "float32"), ("onnx", "float32"), ("torch", "bfloat16")}
    bf16 = rows[("torch", "bfloat16")]
    assert bf16["passes"] is False and bf16["finite"] is True
    assert bf16["top_k_recall"] < 1.0 or bf16["max_dot_diff"] > MAX_DOT_DIFF
    assert set(bf16["failed"]) <= {"top_k_recall", "max_dot_diff"} and bf16["failed"]
    for name in (("torch", "float32"), ("onnx", "float32")):
        assert rows[name]["passes"] and rows[name]["top_k_recall"] == 1.0
        assert rows[name]["max_dot_diff"] <= 1e-6
    assert chosen.info.dtype == backend["dtype"] == "float32"
    (failed,) = [e for e in logs if e["event"] == "backend_failed_checks"]
    assert (failed["backend"], failed["dtype"]) == ("torch", "bfloat16")
    assert failed["failed"] == bf16["failed"]
    reference = load_engine(Settings(model_id=str(splade), backend="torch", dtype="float32"))
    for got, want in zip(sparse_answers(chosen), sparse_answers(reference), strict=True):
        assert np.array_equal(got.indices, want.indices)
        np.testing.assert_allclose(got.values, want.values, atol=1e-5)


def test_the_bfloat16_candidate_set_explicitly_is_served_with_its_failed_checks(
    splade: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DTYPE=bfloat16 serves what it asks for, and /info shows which checks it fails: the
    same checks on its served answers to the check's texts give what /info says."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with captured_logs(candidates) as logs:
        bf16 = load_engine(Settings(model_id=str(splade), backend="torch", dtype="bfloat16"))
    (row,) = bf16.info.summary()["backend"]["candidates"]
    assert row["dtype"] == "bfloat16" and row["quality"]["failed"]
    (line,) = [e for e in logs if e["event"] == "backend_below_quality"]
    assert line["failed"] == row["quality"]["failed"]
    reference = load_engine(Settings(model_id=str(splade), backend="torch", dtype="float32"))

    def weights(engine: Any) -> torch.Tensor:
        units = [engine.prepare(Unit(op=Op.SPARSE, text=t)) for t in backend_choice.TEXTS]
        return torch.from_numpy(np.stack([a.dense() for a in engine.run(units)]))

    served = sparse_quality(weights(reference), weights(bf16))
    assert list(served.failed()) == row["quality"]["failed"]
    assert served.top_k_recall == pytest.approx(row["quality"]["top_k_recall"], abs=1e-6)
    assert served.max_dot_diff == pytest.approx(row["quality"]["max_dot_diff"], abs=1e-5)
