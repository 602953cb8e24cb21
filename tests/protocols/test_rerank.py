"""The rerank routes in-process: Cohere's and the Jina/vLLM shape score with the
cross-encoder's own activation (`CrossEncoder.predict`), TEI's `/rerank` with TEI's rule;
models they cannot serve answer 424; input types on TEI's `prompt_name`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from family_models import sentence_model
from helpers import app_client
from sentence_transformers import CrossEncoder, SentenceTransformer

QUERY = "which city is the capital of france"
DOCUMENTS = ["berlin is the capital of germany", "paris is the capital of france", "hello"]


def with_activation(folder: Path, target: Path, path: str) -> Path:
    """A copy of `folder` whose config names `path` as the cross-encoder's activation."""
    copy = shutil.copytree(folder, target)
    config = json.loads((copy / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": path}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_scores_use_the_models_own_activation(cross_encoder_model: Path, tmp_path: Path) -> None:
    folder = with_activation(
        cross_encoder_model, tmp_path / "identity", "torch.nn.modules.linear.Identity"
    )
    logits = CrossEncoder(str(folder), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    sigmoid = 1 / (1 + np.exp(-logits))
    assert np.abs(logits - sigmoid).min() > 0.1  # the two rules answer apart
    order = sorted(range(3), key=lambda i: -logits[i])
    with app_client(folder) as client:
        assert client.get("/info").json()["model"]["score_activation"] == "identity"
        body = {"query": QUERY, "documents": DOCUMENTS}
        for path in ("/v2/rerank", "/v1/rerank"):
            results = client.post(path, json=body).json()["results"]
            assert [r["index"] for r in results] == order, path
            got = [r["relevance_score"] for r in results]
            assert np.abs(np.asarray(got) - logits[order]).max() < 1e-4, path
        tei = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
        assert np.abs(np.asarray([r["score"] for r in tei]) - sigmoid[order]).max() < 1e-4


def test_an_activation_we_cannot_apply_is_424(cross_encoder_model: Path, tmp_path: Path) -> None:
    folder = with_activation(cross_encoder_model, tmp_path / "relu", "torch.nn.ReLU")
    with app_client(folder) as client:
        for path in ("/v2/rerank", "/v1/rerank"):
            r = client.post(path, json={"query": "q", "documents": ["a"]})
            assert r.status_code == 424 and "torch.nn.ReLU" in r.text, r.text
        assert client.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200
        paths = client.get("/openapi.json").json()["paths"]
        assert "/rerank" in paths and "/v2/rerank" not in paths


def test_a_classifier_with_several_labels_is_not_a_reranker(
    tiny_models: dict[str, Path],
) -> None:
    with app_client(tiny_models["text-classification"]) as client:
        r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 424 and "3 labels" in r.json()["error"]["message"]
        r = client.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 424 and "3 labels" in r.json()["message"]


def test_input_types_are_prompt_names_on_every_route(tmp_path: Path) -> None:
    """`search_document` on a folder without a document prompt is the plain text, not the
    default prompt; the folder's own prompt of that name is used where it has one."""
    folder = sentence_model(
        tmp_path / "q", "bert", ("mean",), prompts={"query": "q: "}, default_prompt_name="query"
    )
    st = SentenceTransformer(str(folder), device="cpu")
    texts = ["paris is big", "hello world"]
    cases = {"search_query": "q: ", "search_document": "", "clustering": "", None: "q: "}
    with app_client(folder) as client:
        assert client.get("/info").json()["model"]["prompts"] == ["query"]
        for name, prompt in cases.items():
            expected = st.encode(texts, prompt=prompt)
            tei = client.post("/embed", json={"inputs": texts, "prompt_name": name}).json()
            assert np.abs(np.asarray(tei) - expected).max() < 1e-4, name
        enum = client.get("/openapi.json").json()["components"]["schemas"]["EmbedRequest"]
        names = enum["properties"]["prompt_name"]["anyOf"][0]["enum"]
        assert {"query", "document", "search_query", "search_document"} <= set(names)
        r = client.post("/embed", json={"inputs": "a", "prompt_name": "nope"})
        assert r.status_code == 422 and "search_query" in r.json()["error"]


@pytest.mark.parametrize("top_n", [1, 2, 5])
def test_top_n_keeps_the_best(cross_encoder_model: Path, top_n: int) -> None:
    scores = CrossEncoder(str(cross_encoder_model), device="cpu").predict(
        [(QUERY, d) for d in DOCUMENTS]
    )
    order = sorted(range(3), key=lambda i: -scores[i])
    with app_client(cross_encoder_model) as client:
        body = {"query": QUERY, "documents": DOCUMENTS, "top_n": top_n}
        for path in ("/v2/rerank", "/v1/rerank"):
            results = client.post(path, json=body).json()["results"]
            assert [r["index"] for r in results] == order[:top_n], path
