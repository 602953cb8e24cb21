"""Static embedding models (sentence-transformers' StaticEmbedding) in process: every dense
embedding route against `SentenceTransformer(folder).encode` on a tiny seeded folder, its
options (normalize, dimensions, prompts, encodings, Cohere's max_tokens), what it does not
serve (token rows, late chunking) and the folders and settings refused at start."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import app_client
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from starlette.testclient import TestClient
from static_models import DIMENSION, as_model2vec, bare_model2vec, static_model

from service.engine.loading.load import preflight
from service.settings import Settings

TEXTS = [
    "hello",
    "paris is the capital of france.",
    "john lives in london and works in paris " * 8,
    "unknownword zzz",
]
TOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return static_model(tmp_path_factory.mktemp("static") / "model")


@pytest.fixture(scope="module")
def reference(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def client(folder: Path) -> Iterator[TestClient]:
    with app_client(folder) as c:
        yield c


def test_every_dense_route_answers_encode(
    client: TestClient, reference: SentenceTransformer
) -> None:
    want = reference.encode(TEXTS)
    tei = client.post("/embed", json={"inputs": TEXTS})
    assert tei.status_code == 200 and np.allclose(tei.json(), want, atol=TOL)
    hf = client.post("/", json={"inputs": TEXTS})
    assert hf.status_code == 200 and np.allclose(hf.json(), want, atol=TOL)
    openai = client.post("/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
    assert np.allclose([d["embedding"] for d in openai["data"]], want, atol=TOL)
    ids = [reference.tokenize([t])["input_ids"].tolist() for t in TEXTS]
    assert openai["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    cohere = client.post(
        "/v2/embed", json={"texts": TEXTS, "model": "m", "input_type": "search_document"}
    ).json()
    passages = reference.encode(TEXTS, prompt_name="document")
    assert np.allclose(cohere["embeddings"]["float"], passages, atol=TOL)
    sim = client.post(
        "/similarity", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    )
    cosines = reference.similarity(want[:1], want[1:]).numpy()[0]
    assert sim.status_code == 200 and np.allclose(sim.json(), cosines, atol=TOL)


def test_one_request_each_equals_one_batch(
    client: TestClient, reference: SentenceTransformer
) -> None:
    want = reference.encode(TEXTS)
    for text, vector in zip(TEXTS, want, strict=True):
        got = client.post("/embed", json={"inputs": text}).json()
        assert np.allclose(got[0], vector, atol=TOL)


def test_options_behave_as_for_other_dense_models(
    client: TestClient, reference: SentenceTransformer
) -> None:
    raw_model = SentenceTransformer(modules=[reference[0]], device="cpu")  # no Normalize
    unnormalized = client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
    assert np.allclose(unnormalized, raw_model.encode(TEXTS), atol=TOL)
    cut = client.post("/embed", json={"inputs": TEXTS, "dimensions": 4})
    short = raw_model.encode(TEXTS)[:, :4]
    short /= np.linalg.norm(short, axis=1, keepdims=True)
    assert cut.status_code == 200 and np.allclose(cut.json(), short, atol=TOL)
    assert "not trained for it" in cut.headers["warning"]
    queries = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"}).json()
    assert np.allclose(queries, reference.encode(TEXTS, prompt_name="query"), atol=TOL)
    b64 = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64.json()["data"]]
    assert np.allclose(decoded, reference.encode(TEXTS), atol=TOL)
    bits = client.post("/embed", json={"inputs": TEXTS, "encoding_format": "ubinary"}).json()
    assert bits == np.asarray(quantize_embeddings(reference.encode(TEXTS), "ubinary")).tolist()
    int8 = client.post("/embed", json={"inputs": TEXTS, "encoding_format": "int8"})
    assert int8.status_code == 200 and all(-128 <= v <= 127 for row in int8.json() for v in row)


def test_cohere_max_tokens_cuts_or_refuses(
    client: TestClient, reference: SentenceTransformer
) -> None:
    long = TEXTS[2]
    ids = reference.tokenize([long])["input_ids"].tolist()
    cut = client.post(
        "/v2/embed",
        json={"texts": [long], "model": "m", "input_type": "clustering", "max_tokens": 5},
    )
    head = reference[0].tokenizer.decode(ids[:5])
    assert cut.status_code == 200
    assert np.allclose(cut.json()["embeddings"]["float"][0], reference.encode(head), atol=TOL)
    refused = client.post(
        "/v2/embed",
        json={
            "texts": [long],
            "model": "m",
            "input_type": "clustering",
            "max_tokens": 5,
            "truncate": "NONE",
        },
    )
    assert refused.status_code == 422 and "max_tokens is 5" in refused.json()["message"]


def test_what_a_static_model_does_not_serve_is_a_4xx_naming_it(client: TestClient) -> None:
    rows = client.post("/embed_all", json={"inputs": "hello"})
    assert rows.status_code == 424 and "/embed_all is not served" in rows.json()["error"]
    late = client.post("/embed", json={"inputs": TEXTS[:2], "late_chunking": True})
    assert late.status_code == 422 and "late_chunking" in late.json()["error"]
    wide = client.post("/embed", json={"inputs": "hello", "dimensions": DIMENSION + 1})
    assert wide.status_code == 422 and "dimensions" in wide.json()["error"]
    sparse = client.post("/embed_sparse", json={"inputs": "hello"})
    assert sparse.status_code == 424


def test_info_describes_the_static_model(client: TestClient) -> None:
    info = client.get("/info").json()
    model = info["model"]
    assert model["static"] == {
        "dimension": DIMENSION,
        "vocabulary": model["vocab_size"],
        "max_input_tokens": None,
        "weights": "sentence-transformers",
    }
    assert model["modules"] == ["StaticEmbedding", "Normalize"] and model["normalize"] is True
    assert model["max_input_tokens"] is None and model["dimension"] == DIMENSION
    assert info["limits"]["late_chunking"] is None
    tokens = client.post("/tokenize", json={"inputs": "hello"}).json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "hello", "[SEP]"]


def test_a_matryoshka_card_allows_cuts_without_a_warning(tmp_path: Path) -> None:
    trained = static_model(tmp_path / "mrl")
    (trained / "README.md").write_text("Trained with MatryoshkaLoss.\n")
    with app_client(trained) as c:
        assert c.get("/info").json()["model"]["matryoshka_dimensions"] == "any"
        cut = c.post("/embed", json={"inputs": "a", "dimensions": 8})
        assert cut.status_code == 200 and "warning" not in cut.headers
        assert len(cut.json()[0]) == 8


def test_model2vec_rows_are_folded_as_sentence_transformers_folds_them(tmp_path: Path) -> None:
    folder = as_model2vec(static_model(tmp_path / "m2v", normalize=False))
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    with app_client(folder) as c:
        assert np.allclose(c.post("/embed", json={"inputs": TEXTS}).json(), want, atol=TOL)
        assert c.get("/info").json()["model"]["static"]["weights"] == "model2vec"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"task": "text-classification"}, "TASK=text-classification does not apply"),
        ({"pooling": "mean"}, "POOLING=mean does not apply"),
        ({"backend": "onnx"}, "DTYPE=float32 or auto"),
        ({"dtype": "bfloat16"}, "served in float32|serves feature-extraction"),
    ],
)
def test_settings_that_do_not_apply_are_refused_naming_what_is_served(
    folder: Path, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        preflight(Settings(model_id=str(folder), **settings))


def test_refused_folders_name_what_is_served(tmp_path: Path, folder: Path) -> None:
    with pytest.raises(ValueError, match="model2vec package") as bare:
        preflight(Settings(model_id=str(bare_model2vec(tmp_path / "bare"))))
    assert "StaticEmbedding -> optional Normalize" in str(bare.value)
    import json
    import shutil

    odd = shutil.copytree(folder, tmp_path / "odd")
    modules = json.loads((odd / "modules.json").read_text())
    (odd / "modules.json").write_text(json.dumps(modules[::-1]))
    with pytest.raises(ValueError, match="Normalize -> StaticEmbedding: a static embedding"):
        preflight(Settings(model_id=str(odd)))
