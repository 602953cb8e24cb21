"""BGE-M3 folders (FlagEmbedding's layout): `/embed`, `/embed_sparse`, `/embed_multi` and
`/embed_hybrid` against FlagEmbedding 1.4.2's `BGEM3FlagModel.encode` (run in its own
environment: `m3_models`), in float32; the lexical-weight rule, the layout's refusals and the
routes' errors in process; the real server, its OpenAPI document and schemathesis on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ServerProcess, app_client, schemathesis_finds_nothing
from m3_models import COLBERT_DIM, flag_encode, m3_model, reference_python
from starlette.testclient import TestClient

from service.engine.folders import UnsupportedModel, is_m3
from service.engine.loading.load import preflight
from service.engine.pooling import m3
from service.engine.pooling.sparse import SparseVector
from service.settings import Settings

TEXTS = [
    "paris is the capital of france.",
    "the cat sat on the mat and the cat",
    "hello world",
    "john lives in london and works at acme on monday with some words and more text",
]
TOLERANCE = 1e-5  # float32: the same operations in another order


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return m3_model(tmp_path_factory.mktemp("models") / "bge-m3-tiny")


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, Any]:
    python = reference_python()
    if isinstance(python, str):
        pytest.skip(f"FlagEmbedding's environment could not be built: {python}")
    return flag_encode(python, folder, TEXTS)


@pytest.fixture(scope="module")
def client(folder: Path) -> Any:
    with app_client(folder, max_batch_wait_ms=20) as c:
        yield c


def assert_matches(answers: dict[str, list[Any]], reference: dict[str, Any]) -> None:
    """Each output the answers hold equals FlagEmbedding's for the same texts."""
    if "dense" in answers:
        got = np.asarray(answers["dense"], dtype=np.float32)
        assert np.abs(got - np.asarray(reference["dense"])).max() < TOLERANCE
    for i, expected in enumerate(reference["lexical_weights"]):
        if "sparse" in answers:
            got_sparse = {str(p["index"]): p["value"] for p in answers["sparse"][i]}
            assert sorted(got_sparse) == sorted(expected), i
            assert all(abs(got_sparse[k] - v) < TOLERANCE for k, v in expected.items())
        if "multi_vector" in answers:
            rows = np.asarray(answers["multi_vector"][i])
            assert rows.shape == np.asarray(reference["colbert_vecs"][i]).shape
            assert np.abs(rows - np.asarray(reference["colbert_vecs"][i])).max() < TOLERANCE


def separate_calls(post: Any) -> dict[str, list[Any]]:
    return {
        "dense": post("/embed", json={"inputs": TEXTS}).json(),
        "sparse": post("/embed_sparse", json={"inputs": TEXTS}).json(),
        "multi_vector": post(
            "/embed_multi", json={"inputs": TEXTS, "input_type": "document"}
        ).json(),
    }


def one_call(post: Any, **asked: bool) -> dict[str, list[Any]]:
    r = post("/embed_hybrid", json={"inputs": TEXTS, **asked})
    assert r.status_code == 200, r.text
    names = [n for n in ("dense", "sparse", "multi_vector") if n in r.json()[0]]
    return {n: [item[n] for item in r.json()] for n in names}


# -- in process -------------------------------------------------------------------------------
def test_each_route_equals_flagembedding(client: TestClient, reference: dict[str, Any]) -> None:
    assert_matches(separate_calls(client.post), reference)


@pytest.mark.parametrize(
    "asked",
    [
        {"dense": True, "sparse": True, "multi_vector": True},
        {},  # dense and sparse
        {"dense": False, "sparse": False, "multi_vector": True},
        {"dense": True, "sparse": False},
    ],
)
def test_one_call_answers_the_asked_outputs(
    client: TestClient, reference: dict[str, Any], asked: dict[str, bool]
) -> None:
    answers = one_call(client.post, **asked)
    expected = {"dense": True, "sparse": True, "multi_vector": False} | asked
    assert set(answers) == {n for n, wanted in expected.items() if wanted}
    assert_matches(answers, reference)


def test_info_openapi_and_the_dense_dialects(client: TestClient, folder: Path) -> None:
    info = client.get("/info").json()["model"]
    assert info["hybrid"] == {
        "dense": 32,
        "sparse": info["vocab_size"],
        "multi_vector": COLBERT_DIM,
        "route": "/embed_hybrid",
    }
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/embed", "/embed_sparse", "/embed_multi", "/embed_hybrid"} <= set(paths)
    dense = client.post("/embed", json={"inputs": TEXTS[:2]}).json()
    openai = client.post("/v1/embeddings", json={"input": TEXTS[:2]}).json()
    cohere = client.post(
        "/v2/embed",
        json={"texts": TEXTS[:2], "input_type": "search_document", "embedding_types": ["float"]},
    ).json()
    assert np.allclose([d["embedding"] for d in openai["data"]], dense, atol=1e-6)
    assert np.allclose(cohere["embeddings"]["float"], dense, atol=1e-6)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"inputs": "a", "dense": False, "sparse": False}, "ask for at least one"),
        ({"inputs": "a", "sparse": "yes"}, "sparse: Input should be a valid boolean"),
        ({"inputs": "a", "max_active_dims": 0}, "max_active_dims: Input should be greater"),
        ({"inputs": "a", "colbert": True}, "unknown field(s) colbert"),
        ({"inputs": []}, "inputs is an empty list"),
    ],
)
def test_bad_requests_are_422_naming_the_field(
    client: TestClient, body: dict[str, Any], message: str
) -> None:
    r = client.post("/embed_hybrid", json=body)
    assert r.status_code == 422 and message in r.json()["error"], r.text


def test_max_active_dims_keeps_the_largest_weights(client: TestClient) -> None:
    full = client.post("/embed_sparse", json={"inputs": TEXTS[0]}).json()[0]
    top = client.post("/embed_hybrid", json={"inputs": TEXTS[0], "max_active_dims": 2}).json()
    expected = sorted(sorted(full, key=lambda p: -p["value"])[:2], key=lambda p: p["index"])
    assert top[0]["sparse"] == expected


def test_embed_hybrid_on_another_model_is_424(embedded_client: TestClient) -> None:
    r = embedded_client.post("/embed_hybrid", json={"inputs": "a"})
    assert r.status_code == 424
    assert r.json()["error"].startswith("/embed_hybrid is not served by this deployment")


def test_lexical_weights_keep_each_ids_largest_positive_weight() -> None:
    heads = m3.M3Heads(colbert=None, sparse=None, unused=frozenset({0, 2}), vocab_size=10)
    ids = np.array([0, 5, 7, 5, 2, 9, 3])
    weights = np.array([0.9, 0.2, 0.0, 0.6, 0.8, 0.1, 0.4], dtype=np.float32)
    got = m3.lexical_weights(weights, ids, heads)
    assert got.indices.tolist() == [3, 5, 9]  # 0 and 2 unused, 7 weighs 0
    assert got.values.tolist() == pytest.approx([0.4, 0.6, 0.1])
    kept = m3.keep_top(SparseVector(got.indices, got.values, 10), 2)
    assert kept.indices.tolist() == [3, 5]


def test_one_head_without_the_other_is_refused(folder: Path, tmp_path: Path) -> None:
    half = tmp_path / "half"
    half.mkdir()
    for f in folder.iterdir():
        if f.name != "sparse_linear.pt":
            (half / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UnsupportedModel, match=r"colbert_linear\.pt without sparse_linear\.pt"):
        is_m3(half)
    with pytest.raises(ValueError, match=r"colbert_linear\.pt without sparse_linear\.pt"):
        preflight(Settings(model_id=str(half)))
    assert is_m3(folder)


# -- the real server ----------------------------------------------------------------------------
@pytest.mark.server
def test_real_server_serves_a_bge_m3_folder(
    start_server: Any, folder: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    server: ServerProcess = start_server(
        MODEL_ID=str(folder), MAX_CLIENT_BATCH_SIZE="8", LONG_INPUTS="truncate"
    )
    server.wait_ready()
    assert_matches(separate_calls(server.post), reference)
    assert_matches(one_call(server.post, multi_vector=True), reference)
    schemathesis_finds_nothing(server.url, tmp_path)
