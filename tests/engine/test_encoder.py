"""EncoderEngine.prepare_many: one tokenizer call per kind of text, the same as one each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.engine.forward.encoder import EncoderEngine
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.engine.params import EmbedParams, PairParams
from service.engine.types import Prepared
from service.errors import InvalidInput
from service.settings import Settings

LONG = " ".join(["paris is the capital of france and berlin is a big city"] * 30)  # > 256 tokens


@pytest.fixture(scope="module")
def embedder() -> EncoderEngine:
    engine = load_engine(Settings())  # the embedded MiniLM: pooled, normalized
    assert isinstance(engine, EncoderEngine)
    return engine


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_model: Path) -> EncoderEngine:
    engine = load_engine(Settings(model_id=str(cross_encoder_model)))
    assert isinstance(engine, EncoderEngine)
    return engine


def units_of_every_kind() -> list[Unit]:
    return [
        Unit(op=Op.EMBED, text="A man is playing a guitar."),
        Unit(op=Op.EMBED, text=LONG),  # over the limit: its own 422
        Unit(op=Op.EMBED, text=LONG, params=EmbedParams(truncate=True)),
        Unit(op=Op.EMBED, text=LONG, params=EmbedParams(truncate=True, direction="left")),
        Unit(op=Op.ROWS, text="short"),
        Unit(op=Op.EMBED, ids=[101, 7592, 102]),
        Unit(op=Op.TOKENIZE, text="tokens please"),
        Unit(op=Op.DECODE, ids=[101, 7592, 102]),
        Unit(op=Op.DECODE, ids=[10**9]),  # outside the vocabulary: its own 422
        Unit(op=Op.EMBED, text="The stock market fell sharply today, analysts said."),
    ]


def alone(engine: EncoderEngine, unit: Unit) -> Prepared | Exception:
    try:
        return engine.prepare(unit)
    except Exception as exc:
        return exc


def same(a: Prepared | Exception, b: Prepared | Exception) -> None:
    assert type(a) is type(b)
    if isinstance(a, Exception):
        assert str(a) == str(b)
        return
    assert isinstance(b, Prepared)
    assert a.unit is b.unit and a.n_tokens == b.n_tokens and a.answer == b.answer
    if a.payload is None:
        assert b.payload is None
    else:
        assert a.payload.ids == b.payload.ids
        assert a.payload.type_ids == b.payload.type_ids
        assert a.payload.prompt_tokens == b.payload.prompt_tokens


def test_prepare_many_answers_each_unit_as_prepare_does(embedder: EncoderEngine) -> None:
    units = units_of_every_kind()
    many = embedder.prepare_many(units)
    assert len(many) == len(units)
    for unit, result in zip(units, many, strict=True):
        same(result, alone(embedder, unit))
    assert isinstance(many[1], InvalidInput) and "at most 256 tokens" in str(many[1])
    assert isinstance(many[8], InvalidInput) and "vocabulary" in str(many[8])
    cut_right, cut_left = many[2], many[3]
    assert isinstance(cut_right, Prepared) and isinstance(cut_left, Prepared)
    assert cut_right.n_tokens == cut_left.n_tokens == 256
    assert cut_right.payload.ids != cut_left.payload.ids  # each cut at its own end


def test_a_batch_of_texts_embeds_as_sentence_transformers_does(embedder: EncoderEngine) -> None:
    """The batched tokenization feeds the forward: the answers match sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    texts = ["A man is playing a guitar.", "hello", "The stock market fell sharply today."]
    prepared = embedder.prepare_many([Unit(op=Op.EMBED, text=t) for t in texts])
    assert all(isinstance(p, Prepared) for p in prepared)
    ours = np.stack(embedder.run([p for p in prepared if isinstance(p, Prepared)]))
    folder = embedder.pipe.model.name_or_path
    reference = SentenceTransformer(folder, device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=2e-5)


def test_pairs_and_single_texts_are_tokenized_apart(cross_encoder: EncoderEngine) -> None:
    units = [
        Unit(op=Op.LOGITS, text="what is the capital of france?", pair="Paris is."),
        Unit(op=Op.LOGITS, text="what is the capital of france?"),
        Unit(op=Op.LOGITS, text="a query", pair=LONG, params=PairParams(truncate=True)),
        Unit(
            op=Op.LOGITS,
            text="a query",
            pair=LONG,
            params=PairParams(truncate=True, direction="left"),
        ),
    ]
    many = cross_encoder.prepare_many(units)
    for unit, result in zip(units, many, strict=True):
        same(result, alone(cross_encoder, unit))
    first = many[0]
    assert isinstance(first, Prepared) and first.payload.type_ids is not None
    assert 1 in first.payload.type_ids  # the pair's second segment


def test_a_text_the_tokenizer_rejects_fails_alone(
    embedder: EncoderEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the one call for a group raises, each text of it is tried alone: only the text
    that breaks the tokenizer gets the error."""
    real = embedder.tok.__class__.__call__

    def picky(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        texts = text if isinstance(text, list) else [text]
        if any("poison" in t for t in texts):
            raise RuntimeError("tokenizer exploded")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(embedder.tok.__class__, "__call__", picky)
    units = [Unit(op=Op.EMBED, text=t) for t in ("fine", "poison pill", "also fine")]
    many = embedder.prepare_many(units)
    assert isinstance(many[0], Prepared) and isinstance(many[2], Prepared)
    assert isinstance(many[1], RuntimeError)


def test_loading_caps_the_kernel_caches_unless_the_environment_sets_them(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN's per-shape kernel cache is capped at 512 and ideep's at 64 (`KERNEL_CACHES`:
    the RSS bound under ever new batch shapes); oneDNN's holds every packed shape bucket's
    kernels (5 a bucket, 64 buckets up to 8,192 tokens) and a classifier head's for each batch
    size up to 64; an operator's own value is kept."""
    from service.backends.packing import tokens_up_to
    from service.engine.loading.load import KERNEL_CACHES

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "512")
    load_engine(Settings(model_id=str(tiny_models["text-classification"])))
    assert KERNEL_CACHES == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512", "LRU_CACHE_CAPACITY": "64"}
    assert 5 * len(tokens_up_to(8192)) + 64 <= 512
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    assert os.environ["LRU_CACHE_CAPACITY"] == "512"
