"""huggingface_hub's InferenceClient against the real server, for every served task.

Each answer equals the reference library's within 1e-4 (sentence-transformers for embeddings
and similarity, a direct pipeline call for the rest), and the JSON that `POST /` answers for
the same request validates against the task's output spec (`specs_check`). One server per
model, started once for this module (gunicorn on 127.0.0.1, a free port).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import SEED_TEXT, ServerProcess
from models import build_sentence_model
from specs_check import check_answer

from service.engine.loading.load import default_model_dir

pytestmark = pytest.mark.server

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays the guitar on a small stage in the evening, and the crowd sings along.",
    "Stocks fell.",
]
LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 30  # ~390 tokens
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """`servers(name, MODEL_ID=..., ...)`: one real server per name, started on first use."""
    started: dict[str, ServerProcess] = {}
    logs = tmp_path_factory.mktemp("client-servers")

    def get(name: str, **env: str) -> ServerProcess:
        if name not in started:
            started[name] = ServerProcess(env, logs / f"{name}.log")
            started[name].wait_ready()
        return started[name]

    yield get
    for server in started.values():
        assert server.terminate() == 0


@pytest.fixture
def client_for(
    servers: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[Any, ServerProcess]]:
    """An InferenceClient pointed at a server (the client refuses URLs while HF_HUB_OFFLINE is
    on in its own process; the server keeps it on)."""
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def make(name: str, **env: str) -> tuple[Any, ServerProcess]:
        server = servers(name, **env)
        return InferenceClient(model=server.url, timeout=60), server

    return make


def _post(server: ServerProcess, body: Any) -> Any:
    r = httpx.post(server.url + "/", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def st() -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(default_model_dir(), device="cpu")


# -- feature-extraction and sentence-similarity ---------------------------------------------
def test_feature_extraction_single_and_list(client_for: Callable[..., Any], st: Any) -> None:
    client, server = client_for("embedded")
    one = client.feature_extraction(SENTENCES[0])
    assert one.shape == (1, 384)
    assert np.abs(one[0] - st.encode([SENTENCES[0]])[0]).max() < 1e-4
    many = client.feature_extraction(SENTENCES)  # LangChain's embed_documents calls this
    assert many.shape == (3, 384)
    assert np.abs(many - st.encode(SENTENCES)).max() < 1e-4
    check_answer("feature-extraction", _post(server, {"inputs": SENTENCES[0]}))
    check_answer("feature-extraction", _post(server, {"inputs": SENTENCES}), is_list=True)


def test_feature_extraction_normalize_false(client_for: Callable[..., Any], st: Any) -> None:
    from sentence_transformers import SentenceTransformer

    client, _ = client_for("embedded")
    raw = SentenceTransformer(modules=[st[0], st[1]], device="cpu")  # without its Normalize
    got = client.feature_extraction(SENTENCES, normalize=False)
    assert np.abs(got - raw.encode(SENTENCES)).max() < 1e-4
    assert np.linalg.norm(got[0]) > 1.5  # really not normalized


def test_feature_extraction_truncate_both_directions(
    client_for: Callable[..., Any], st: Any
) -> None:
    import httpx as _httpx

    client, server = client_for("embedded")
    r = _httpx.post(server.url + "/", json={"inputs": LONG}, timeout=60)
    assert r.status_code == 422 and "256 tokens" in r.json()["error"]  # never a silent cut
    right = client.feature_extraction(LONG, truncate=True)
    assert np.abs(right[0] - st.encode([LONG])[0]).max() < 1e-4  # ST cuts at max_seq_length
    left = client.feature_extraction(LONG, truncate=True, truncation_direction="left")
    st.tokenizer.truncation_side = "left"
    try:
        expected_left = st.encode([LONG])[0]
    finally:
        st.tokenizer.truncation_side = "right"
    assert np.abs(left[0] - expected_left).max() < 1e-4
    assert np.abs(left[0] - right[0]).max() > 1e-3  # a different cut


def test_feature_extraction_prompt_name(
    client_for: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_sentence_model(
        tmp_path_factory.mktemp("prompted") / "model", ("mean",), prompts=PROMPTS
    )
    client, _ = client_for("prompted", MODEL_ID=str(folder))
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = ["paris is the capital of france", "a big river"]
    for name in ("query", "passage"):
        got = client.feature_extraction(texts, prompt_name=name)
        expected = reference.encode(texts, prompt_name=name)
        assert np.abs(got - expected).max() < 1e-4
    plain = client.feature_extraction(texts)
    assert np.abs(plain - reference.encode(texts)).max() < 1e-4
    assert np.abs(plain - client.feature_extraction(texts, prompt_name="query")).max() > 1e-3


def test_sentence_similarity(client_for: Callable[..., Any], st: Any) -> None:
    from sentence_transformers import util

    client, server = client_for("embedded")
    scores = client.sentence_similarity(SENTENCES[0], other_sentences=SENTENCES[1:])
    vectors = st.encode(SENTENCES, convert_to_tensor=True)
    expected = util.cos_sim(vectors[0:1], vectors[1:])[0].tolist()
    assert scores == pytest.approx(expected, abs=1e-4)
    body = {"inputs": {"source_sentence": SENTENCES[0], "sentences": SENTENCES[1:]}}
    check_answer("sentence-similarity", _post(server, body))


# -- text-classification, fill-mask, token-classification, zero-shot -------------------------
def _scores(answer: list[Any]) -> dict[str, float]:
    return {x["label"]: x["score"] for x in answer}


def test_text_classification_all_labels_and_top_k(
    client_for: Callable[..., Any], tiny_models: dict[str, Path]
) -> None:
    from transformers import pipeline

    model = tiny_models["text-classification"]
    client, server = client_for("text-classification", MODEL_ID=str(model))
    direct = pipeline("text-classification", model=str(model))
    text = "good happy city"
    every = client.text_classification(text)
    assert len(every) == 3  # every label, highest first (the client's docstring form)
    expected = direct(text, top_k=None)
    assert [x.label for x in every] == [x["label"] for x in expected] or _near_tie(expected)
    assert _scores([vars(x) for x in every]) == pytest.approx(_scores(expected), abs=1e-4)
    two = client.text_classification(text, top_k=2)
    assert len(two) == 2
    assert _scores([vars(x) for x in two]) == pytest.approx(
        _scores(direct(text, top_k=2)), abs=1e-4
    )
    check_answer("text-classification", _post(server, {"inputs": text}))
    listed = _post(server, {"inputs": [text, "bad sad"], "parameters": {"top_k": 1}})
    check_answer("text-classification", listed, is_list=True)


def _near_tie(expected: list[dict[str, Any]]) -> bool:
    scores = sorted(x["score"] for x in expected)
    return any(b - a < 1e-4 for a, b in itertools.pairwise(scores))


def test_fill_mask(client_for: Callable[..., Any], tiny_models: dict[str, Path]) -> None:
    from transformers import pipeline

    model = tiny_models["fill-mask"]
    client, server = client_for("fill-mask", MODEL_ID=str(model))
    got = client.fill_mask(SEED_TEXT, top_k=3)
    expected = pipeline("fill-mask", model=str(model))(SEED_TEXT, top_k=3)
    assert [g.score for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-4)
    assert {g.token_str for g in got} <= {e["token_str"] for e in expected} | {
        g.token_str for g in got if _near_tie(expected)
    }
    check_answer("fill-mask", _post(server, {"inputs": SEED_TEXT}))


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification(
    client_for: Callable[..., Any], tiny_models: dict[str, Path], strategy: str
) -> None:
    from transformers import pipeline

    model = tiny_models["token-classification"]
    client, server = client_for("token-classification", MODEL_ID=str(model))
    text = "John lives in London and works at Acme on Monday."
    got = client.token_classification(text, aggregation_strategy=strategy)
    direct = pipeline("token-classification", model=str(model))
    expected = direct(text, aggregation_strategy=strategy)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert (g.word, g.start, g.end) == (e["word"], e["start"], e["end"])
        assert (g.entity_group or g.entity) == (e.get("entity_group") or e.get("entity"))
        assert g.score == pytest.approx(float(e["score"]), abs=1e-4)
    body = {"inputs": text, "parameters": {"aggregation_strategy": strategy}}
    check_answer("token-classification", _post(server, body))


@pytest.mark.parametrize("multi_label", [False, True])
def test_zero_shot_classification(
    client_for: Callable[..., Any], tiny_models: dict[str, Path], multi_label: bool
) -> None:
    from transformers import pipeline

    model = tiny_models["zero-shot-classification"]
    client, server = client_for("zero-shot", MODEL_ID=str(model))  # the task is inferred
    text, labels = "paris is the capital of france", ["city", "river", "good", "sad"]
    got = client.zero_shot_classification(text, labels, multi_label=multi_label)
    expected = pipeline("zero-shot-classification", model=str(model))(
        text, candidate_labels=labels, multi_label=multi_label
    )
    assert {g.label: g.score for g in got} == pytest.approx(
        dict(zip(expected["labels"], expected["scores"], strict=True)), abs=1e-4
    )
    assert [g.score for g in got] == sorted((g.score for g in got), reverse=True)
    body = {"inputs": text, "parameters": {"candidate_labels": labels}}
    check_answer("zero-shot-classification", _post(server, body))
