"""TEI's routes in-process: answers valid against TEI's own schemas (`tests/specs/tei`) and
equal to the reference (sentence-transformers, the model called directly, the tokenizer),
424 on routes the loaded model cannot serve, and the shared limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import app_client
from models import TEXT_LABELS
from schema_check import check_tei
from sentence_transformers import SentenceTransformer
from starlette.testclient import TestClient
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell sharply today."]
LONG = " ".join(["paris is the capital of france and berlin is a big city"] * 40)  # > 256 tokens
TOL = 1e-4


@pytest.fixture(scope="module")
def st(embedded_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(embedded_model), device="cpu")


@pytest.fixture(scope="module")
def classifier_client(tiny_models: dict[str, Path]) -> Iterator[TestClient]:
    with app_client(tiny_models["text-classification"]) as client:
        yield client


@pytest.fixture(scope="module")
def cross_encoder_client(cross_encoder_model: Path) -> Iterator[TestClient]:
    with app_client(cross_encoder_model, max_client_batch_size=4) as client:
        yield client


def ok(client: TestClient, path: str, body: dict[str, Any], schema: str) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    check_tei(schema, r.json())
    return r.json()


def error(client: TestClient, path: str, body: Any, status: int) -> str:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type", "request_id"}
    return str(r.json()["error"])


def max_diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# -- embedding model: /embed, /embed_all, /similarity, /tokenize, /decode --------------------
def test_embed_equals_sentence_transformers(
    embedded_client: TestClient, st: SentenceTransformer
) -> None:
    expected = st.encode(TEXTS)
    batch = ok(embedded_client, "/embed", {"inputs": TEXTS}, "EmbedResponse")
    assert max_diff(batch, expected) < TOL
    single = ok(embedded_client, "/embed", {"inputs": TEXTS[0]}, "EmbedResponse")
    assert len(single) == 1 and max_diff(single[0], expected[0]) < TOL


def test_embed_options(embedded_client: TestClient, st: SentenceTransformer) -> None:
    expected = st.encode(TEXTS[:1])[0]
    raw = np.asarray(
        ok(embedded_client, "/embed", {"inputs": TEXTS[0], "normalize": False}, "EmbedResponse")[0]
    )
    assert abs(np.linalg.norm(raw) - 1) > 0.1  # mean pooling alone: not unit length
    assert max_diff(raw / np.linalg.norm(raw), expected) < TOL
    cut = ok(embedded_client, "/embed", {"inputs": TEXTS[0], "dimensions": 16}, "EmbedResponse")
    assert max_diff(cut[0], expected[:16] / np.linalg.norm(expected[:16])) < TOL
    # over the model's 256 tokens: TEI's truncate cuts (ST cuts at max_seq_length the same way)
    cut_right = ok(embedded_client, "/embed", {"inputs": LONG, "truncate": True}, "EmbedResponse")
    assert max_diff(cut_right[0], st.encode([LONG])[0]) < TOL
    left = {"inputs": LONG, "truncate": True, "truncation_direction": "Left"}
    assert max_diff(ok(embedded_client, "/embed", left, "EmbedResponse")[0], cut_right[0]) > 1e-3
    assert "at most 256 tokens" in error(embedded_client, "/embed", {"inputs": LONG}, 422)


def test_embed_token_ids_equal_text(embedded_client: TestClient, st: SentenceTransformer) -> None:
    ids = st.tokenizer(TEXTS[0])["input_ids"]
    one = ok(embedded_client, "/embed", {"inputs": ids}, "EmbedResponse")
    mixed = ok(embedded_client, "/embed", {"inputs": [ids, TEXTS[1]]}, "EmbedResponse")
    expected = st.encode(TEXTS[:2])
    assert max_diff(one[0], expected[0]) < TOL
    assert max_diff(mixed, expected) < TOL


def test_embed_all_equals_the_model(embedded_client: TestClient, embedded_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    model = AutoModel.from_pretrained(embedded_model).eval()
    answer = ok(embedded_client, "/embed_all", {"inputs": TEXTS}, "EmbedAllResponse")
    for text, rows in zip(TEXTS, answer, strict=True):
        with torch.inference_mode():
            expected = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        assert np.asarray(rows).shape == tuple(expected.shape)
        assert max_diff(rows, expected.numpy()) < TOL


def test_similarity_equals_cos_sim(embedded_client: TestClient, st: SentenceTransformer) -> None:
    from sentence_transformers.util import cos_sim

    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    answer = ok(embedded_client, "/similarity", body, "SimilarityResponse")
    vectors = st.encode(TEXTS)
    assert max_diff(answer, cos_sim(vectors[:1], vectors[1:])[0].numpy()) < TOL
    assert answer[0] > answer[1] + 0.2


def test_tokenize_matches_the_tokenizer(embedded_client: TestClient, embedded_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    text = "Héllo wörld, [UNK] naïve café!"
    [tokens] = ok(embedded_client, "/tokenize", {"inputs": text}, "TokenizeResponse")
    assert [t["id"] for t in tokens] == tokenizer(text)["input_ids"]
    assert [t["special"] for t in tokens] == [True] + [False] * (len(tokens) - 2) + [True]
    assert (tokens[0]["text"], tokens[0]["start"], tokens[0]["stop"]) == ("[CLS]", None, None)
    raw = text.encode()
    for t in tokens[1:-1]:  # TEI's spans are UTF-8 byte offsets into the input
        assert raw[t["start"] : t["stop"]].decode() == t["text"]
    plain = ok(
        embedded_client,
        "/tokenize",
        {"inputs": [text, "hi"], "add_special_tokens": False},
        "TokenizeResponse",
    )
    assert [t["id"] for t in plain[0]] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(plain) == 2 and not any(t["special"] for t in plain[0])


def test_decode_matches_the_tokenizer(embedded_client: TestClient, embedded_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    ids = tokenizer(TEXTS[0])["input_ids"]
    assert ok(embedded_client, "/decode", {"ids": ids}, "DecodeResponse") == [
        tokenizer.decode(ids, skip_special_tokens=True)
    ]
    both = ok(
        embedded_client,
        "/decode",
        {"ids": [ids, ids[:3]], "skip_special_tokens": False},
        "DecodeResponse",
    )
    assert both == [tokenizer.decode(x, skip_special_tokens=False) for x in (ids, ids[:3])]


# -- classifiers: /predict and /rerank --------------------------------------------------------
def _logits(folder: Path, text: str, pair: str | None = None) -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        out: np.ndarray = model(**tokenizer(text, pair, return_tensors="pt")).logits[0].numpy()
    return out


def _by_label(predictions: list[dict[str, Any]]) -> dict[str, float]:
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True)  # highest first
    return {p["label"]: p["score"] for p in predictions}


def test_predict_softmax_and_raw_scores(
    classifier_client: TestClient, tiny_models: dict[str, Path]
) -> None:
    folder = tiny_models["text-classification"]
    labels = list(TEXT_LABELS.values())
    logits = _logits(folder, "hello world")
    single = ok(classifier_client, "/predict", {"inputs": "hello world"}, "PredictResponse")
    softmax = np.exp(logits) / np.exp(logits).sum()
    assert max_diff([_by_label(single)[x] for x in labels], softmax) < TOL
    raw = ok(
        classifier_client,
        "/predict",
        {"inputs": "hello world", "raw_scores": True},
        "PredictResponse",
    )
    assert max_diff([_by_label(raw)[x] for x in labels], logits) < TOL
    pair = ok(
        classifier_client,
        "/predict",
        {"inputs": ["paris", "france"], "raw_scores": True},
        "PredictResponse",
    )
    assert max_diff([_by_label(pair)[x] for x in labels], _logits(folder, "paris", "france")) < TOL
    batch = ok(
        classifier_client,
        "/predict",
        {"inputs": [["hello world"], ["paris", "france"]], "raw_scores": True},
        "PredictResponse",
    )
    assert len(batch) == 2
    assert max_diff([_by_label(batch[0])[x] for x in labels], logits) < TOL
    assert (
        max_diff([_by_label(batch[1])[x] for x in labels], _logits(folder, "paris", "france")) < TOL
    )


def test_rerank_sigmoid_sorted(cross_encoder_client: TestClient, cross_encoder_model: Path) -> None:
    query, texts = "capital of france", ["paris is a city", "berlin germany", "hello world"]
    logits = np.array([_logits(cross_encoder_model, query, t)[0] for t in texts])
    ranks = ok(cross_encoder_client, "/rerank", {"query": query, "texts": texts}, "RerankResponse")
    assert [r["index"] for r in ranks] == list(np.argsort(-logits))
    assert (
        max_diff([r["score"] for r in ranks], (1 / (1 + np.exp(-logits)))[np.argsort(-logits)])
        < TOL
    )
    assert all("text" not in r for r in ranks)
    raw = ok(
        cross_encoder_client,
        "/rerank",
        {"query": query, "texts": texts, "raw_scores": True, "return_text": True},
        "RerankResponse",
    )
    assert max_diff([r["score"] for r in raw], np.sort(logits)[::-1]) < TOL
    assert [r["text"] for r in raw] == [texts[r["index"]] for r in raw]
    # a one-label model's /predict is the sigmoid of its logit (TEI's)
    [only] = ok(cross_encoder_client, "/predict", {"inputs": [query, texts[0]]}, "PredictResponse")
    assert only["label"] == "LABEL_0"
    assert abs(only["score"] - 1 / (1 + np.exp(-logits[0]))) < TOL


def test_rerank_limits(cross_encoder_client: TestClient) -> None:
    body = {"query": "q", "texts": ["a"] * 5}  # this deployment: MAX_CLIENT_BATCH_SIZE=4
    assert "at most 4" in error(cross_encoder_client, "/rerank", body, 413)
    assert "texts[1] is empty" in error(
        cross_encoder_client, "/rerank", {"query": "q", "texts": ["a", " "]}, 422
    )
    assert "query is empty" in error(
        cross_encoder_client, "/rerank", {"query": "", "texts": ["a"]}, 422
    )
    over = {"query": "q", "texts": [LONG * 3]}
    assert "at most 512 tokens" in error(cross_encoder_client, "/rerank", over, 422)
    cut = ok(cross_encoder_client, "/rerank", {**over, "truncate": True}, "RerankResponse")
    assert len(cut) == 1


# -- 424: a route the model cannot serve -----------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/predict", {"inputs": "x"}),
        ("/rerank", {"query": "x", "texts": ["y"]}),
    ],
)
def test_embedding_model_refuses_classifier_routes(
    embedded_client: TestClient, path: str, body: dict[str, Any]
) -> None:
    message = error(embedded_client, path, body, 424)
    assert f"{path} is not served" in message and "feature-extraction" in message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": "x"}),
        ("/embed_all", {"inputs": "x"}),
        ("/similarity", {"inputs": {"source_sentence": "x", "sentences": ["y"]}}),
    ],
)
def test_classifiers_refuse_embedding_routes(
    classifier_client: TestClient, cross_encoder_client: TestClient, path: str, body: Any
) -> None:
    for client in (classifier_client, cross_encoder_client):
        message = error(client, path, body, 424)
        assert "text-classification" in message
    for client in (classifier_client, cross_encoder_client):
        r = client.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 424
        assert "text-classification" in r.json()["error"]["message"]


def test_rerank_needs_one_label(classifier_client: TestClient) -> None:
    message = error(classifier_client, "/rerank", {"query": "x", "texts": ["y"]}, 424)
    assert "3 labels (NEGATIVE, NEUTRAL, POSITIVE)" in message and "/predict" in message


def test_pipeline_tasks_refuse_tei_routes(fill_mask_client: TestClient) -> None:
    for path, body in [("/tokenize", {"inputs": "x"}), ("/embed", {"inputs": "x"})]:
        assert "fill-mask" in error(fill_mask_client, path, body, 424)


# -- validation and limits --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/embed", {"inputs": ""}, 422, "inputs is empty"),
        ("/embed", {"inputs": []}, 422, "inputs is an empty list"),
        ("/embed", {"inputs": ["ok", 3]}, 422, "inputs[1] must be a string or a list of token ids"),
        ("/embed", {"inputs": [[1, -2]]}, 422, "inputs[0][1] must be a token id"),
        ("/embed", {"inputs": [["my secret"]]}, 422, "inputs[0][0] must be a token id (an "),
        ("/embed", {"inputs": [[1, 2.5]]}, 422, "(an integer >= 0), not a number"),
        ("/embed", {"inputs": [[[[1]] * 2]]}, 422, "inputs[0][0] must be a token id"),
        ("/embed", {"inputs": [999999]}, 422, "token id 999999 is outside"),
        ("/embed", {"inputs": "x", "normalise": True}, 422, "unknown field(s) normalise"),
        ("/embed", {"inputs": "x", "truncation_direction": "up"}, 422, "truncation_direction"),
        ("/embed", {"inputs": "x", "prompt_name": "nope"}, 422, "not one of this model's prompts"),
        (
            "/embed",
            {"inputs": "x", "dimensions": 385},
            422,
            "more than the 384 dimensions this model emits",
        ),
        ("/embed", {"inputs": ["x"] * 2049}, 413, "at most 2048 (MAX_CLIENT_BATCH_SIZE)"),
        ("/embed", [1], 422, "body must be a JSON object"),
        (
            "/similarity",
            {"inputs": {"source_sentence": "x", "sentences": ["y"] * 2048}},
            413,
            "2049 inputs",
        ),
        ("/tokenize", {"inputs": ["a", ""]}, 422, "inputs[1] is empty"),
        ("/decode", {"ids": []}, 422, "ids is an empty list"),
        ("/decode", {"ids": [[1], []]}, 422, "ids[1] is an empty list"),
    ],
)
def test_invalid_requests(
    embedded_client: TestClient, path: str, body: Any, status: int, says: str
) -> None:
    assert says in error(embedded_client, path, body, status)


def test_a_value_in_the_wrong_place_is_named_by_its_kind_not_echoed(
    embedded_client: TestClient,
) -> None:
    """A text where token ids go is a user's input: the answer names its kind, not its words;
    a list nested near orjson's depth limit is a 422 too (its repr overflowed Python's stack)."""
    said = error(embedded_client, "/embed", {"inputs": [["my secret password"]]}, 422)
    assert said.endswith("not a string") and "secret" not in said
    deep = "[" * 1000 + "1" + "]" * 1000
    for path, body in (("/embed", f'{{"inputs": {deep}}}'), ("/decode", f'{{"ids": {deep}}}')):
        headers = {"content-type": "application/json"}
        r = embedded_client.post(path, content=body, headers=headers)
        assert r.status_code == 422, r.text


def test_predict_input_shapes(classifier_client: TestClient) -> None:
    assert "holds 3 strings" in error(
        classifier_client, "/predict", {"inputs": ["a", "b", "c"]}, 422
    )
    assert "inputs[1] must be a list" in error(
        classifier_client, "/predict", {"inputs": [["a"], "b"]}, 422
    )
    assert "inputs[0][1] is empty" in error(
        classifier_client, "/predict", {"inputs": [["a", " "]]}, 422
    )


def test_body_limits_and_content_type(embedded_client: TestClient) -> None:
    r = embedded_client.post(
        "/embed", content=b"x" * (4 * 1024 * 1024 + 1), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    r = embedded_client.post("/embed", content=b"hello", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = embedded_client.post("/embed", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]


def test_deadline_header(embedded_client: TestClient) -> None:
    r = embedded_client.post(
        "/embed", json={"inputs": "x"}, headers={"X-Request-Timeout": "0.000001"}
    )
    assert r.status_code in (503, 504), r.text
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) >= 1
    r = embedded_client.post("/embed", json={"inputs": "x"}, headers={"X-Request-Timeout": "soon"})
    assert r.status_code == 400


def test_openapi_lists_what_each_model_serves(
    embedded_client: TestClient, classifier_client: TestClient, cross_encoder_client: TestClient
) -> None:
    def posts(client: TestClient) -> set[str]:
        doc = client.get("/openapi.json").json()
        return {path for path, item in doc["paths"].items() if "post" in item}

    assert posts(embedded_client) == {
        "/", "/embed", "/embed_all", "/similarity", "/tokenize", "/decode", "/v1/embeddings",
        "/v2/embed",
    }  # fmt: skip
    assert posts(classifier_client) == {"/", "/predict", "/tokenize", "/decode"}  # 3 labels
    assert posts(cross_encoder_client) == {
        "/", "/predict", "/rerank", "/tokenize", "/decode", "/v1/rerank", "/v2/rerank"
    }  # fmt: skip
