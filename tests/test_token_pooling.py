"""Token pooling of multi-vector documents against sentence-transformers 6.3's
`HierarchicalTokenPooling`: the numpy Ward clustering on the same vectors (the vectors within
float32 tolerance, the clusters equal to scipy's `fcluster`), `pool_factor` and
`protected_tokens` on `/embed_multi` against `encode_document(token_pooling=...)`, a folder
that ships the module, the errors, and the real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import ServerProcess, app_client
from retrieval_models import MULTI_VECTOR_KINDS, multi_vector_model
from sentence_transformers import MultiVectorEncoder
from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling
from starlette.testclient import TestClient

from service.engine.multi_vector import token_pooling
from service.engine.multi_vector.config import TokenPooling

DOCUMENTS = [
    "paris is the capital of france.",
    "the river in the city is big, the city is small. " * 3,
    "a sentence with some words and more text about the model test",
    "hello world",
    "berlin",
]
TOLERANCE = 1e-5


def unit_rows(rng: np.random.Generator, n: int, width: int = 8) -> np.ndarray:
    rows = rng.standard_normal((n, width)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize(
    "options",
    [
        {"pool_factor": 2.0},
        {"pool_factor": 1.5, "num_protected_tokens": 0},
        {"pool_factor": 4.0, "num_protected_tokens": 3},
        {"pool_factor": 3.0, "normalize_embeddings": False},
        {"max_tokens": 6},
        {"distance_threshold": 0.6},
    ],
)
def test_pooling_equals_hierarchical_token_pooling(options: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    ours = TokenPooling(
        pool_factor=options.get("pool_factor", 1.0),
        max_tokens=options.get("max_tokens"),
        distance_threshold=options.get("distance_threshold"),
        protected_tokens=options.get("num_protected_tokens", 1),
        normalize=options.get("normalize_embeddings", True),
    )
    reference = HierarchicalTokenPooling(**options)
    shrunk = 0
    for n in (1, 2, 3, 5, 17, 40, 90):
        rows = unit_rows(rng, n)
        expected = reference.pool([torch.from_numpy(rows)])[0].numpy()
        got = token_pooling.pool(rows, ours)
        assert got.shape == expected.shape, n
        assert np.abs(got - expected).max() <= TOLERANCE, n
        shrunk += len(got) < n
    assert shrunk >= 3  # the pooling pooled


def test_clusters_are_scipys_fcluster() -> None:
    """The numbering as well as the partition: the pooled rows come in fcluster's order."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(3, 50))
        target = int(rng.integers(1, n))
        rows = unit_rows(rng, n)
        distances = np.clip(1 - rows @ rows.T, 0, 2)
        tree = linkage(squareform(distances, checks=False), method="ward")
        merges, heights = token_pooling.ward_linkage(distances.astype(np.float64))
        assert (merges == tree[:, :2].astype(int)).all(), trial
        assert np.allclose(heights, tree[:, 2], rtol=1e-12, atol=1e-12), trial
        expected = fcluster(tree, t=target, criterion="maxclust")
        assert (token_pooling._labels(rows, target, None) + 1 == expected).all(), trial


# -- /embed_multi ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pooling")
    kinds = ("colbert", "pooled", "plain")
    return {k: multi_vector_model(root / k, **MULTI_VECTOR_KINDS[k]) for k in kinds}


@pytest.fixture(scope="module")
def colbert(folders: dict[str, Path]) -> Iterator[tuple[MultiVectorEncoder, TestClient]]:
    with app_client(folders["colbert"]) as client:
        yield MultiVectorEncoder(str(folders["colbert"]), device="cpu"), client


def pooled_documents(client: TestClient, **options: Any) -> list[np.ndarray]:
    body = {"inputs": DOCUMENTS, "input_type": "document", "truncate": True, **options}
    r = client.post("/embed_multi", json=body)
    assert r.status_code == 200, r.text
    return [np.asarray(d, dtype=np.float32) for d in r.json()]


def assert_rows(got: list[np.ndarray], expected: list[Any]) -> None:
    for g, e in zip(got, expected, strict=True):
        e = np.asarray(e, dtype=np.float32)
        assert g.shape == e.shape
        assert np.abs(g - e).max() <= 1e-4


@pytest.mark.parametrize(
    "options",
    [{"pool_factor": 2}, {"pool_factor": 1.5, "protected_tokens": 0}, {"pool_factor": 4}],
)
def test_pool_factor_equals_encode_document_with_token_pooling(
    colbert: tuple[MultiVectorEncoder, TestClient], options: dict[str, Any]
) -> None:
    model, client = colbert
    pooling = HierarchicalTokenPooling(
        pool_factor=options["pool_factor"], num_protected_tokens=options.get("protected_tokens", 1)
    )
    expected = model.encode_document(DOCUMENTS, token_pooling=pooling, convert_to_numpy=True)
    got = pooled_documents(client, **options)
    assert_rows(got, expected)
    plain = model.encode_document(DOCUMENTS, convert_to_numpy=True)
    assert sum(len(g) for g in got) < sum(len(p) for p in plain)


def test_queries_are_not_pooled_and_protected_tokens_alone_normalizes(
    folders: dict[str, Path], colbert: tuple[MultiVectorEncoder, TestClient]
) -> None:
    """As `encode_query(token_pooling=...)` leaves queries; `protected_tokens` alone is a
    HierarchicalTokenPooling with pool factor 1: every token vector, normalized."""
    model, client = colbert
    body = {"inputs": DOCUMENTS, "input_type": "query", "pool_factor": 4, "truncate": True}
    r = client.post("/embed_multi", json=body)
    assert_rows([np.asarray(q) for q in r.json()], model.encode_query(DOCUMENTS))
    plain = MultiVectorEncoder(str(folders["plain"]), device="cpu")
    pooling = HierarchicalTokenPooling(num_protected_tokens=3)
    expected = plain.encode_document(DOCUMENTS, token_pooling=pooling)
    unnormalized = plain.encode_document(DOCUMENTS)
    assert abs(float(np.linalg.norm(unnormalized[0][0])) - 1) > 0.01
    with app_client(folders["plain"]) as plain_client:
        assert_rows(pooled_documents(plain_client, protected_tokens=3), expected)


def test_a_folder_with_token_pooling_is_served_with_it(folders: dict[str, Path]) -> None:
    model = MultiVectorEncoder(str(folders["pooled"]), device="cpu")
    with app_client(folders["pooled"]) as client:
        info = client.get("/info").json()["model"]
        assert info["multi_vector"]["token_pooling"] == {
            "pool_factor": 2.0,
            "max_tokens": None,
            "distance_threshold": None,
            "protected_tokens": 2,
            "tasks": ["document"],
        }
        assert info["modules"][-1] == "HierarchicalTokenPooling(2)"
        assert_rows(pooled_documents(client), model.encode_document(DOCUMENTS))
        queries = client.post("/embed_multi", json={"inputs": DOCUMENTS, "input_type": "query"})
        assert_rows([np.asarray(q) for q in queries.json()], model.encode_query(DOCUMENTS))
        # the request's factor in the module's place (its protected tokens kept)
        model[-1].pool_factor = 4.0
        assert_rows(pooled_documents(client, pool_factor=4), model.encode_document(DOCUMENTS))
        model[-1].num_protected_tokens = 0
        got = pooled_documents(client, pool_factor=4, protected_tokens=0)
        assert_rows(got, model.encode_document(DOCUMENTS))
        model[-1].pool_factor = 1.0  # no pooling: every token vector
        assert_rows(pooled_documents(client, pool_factor=1), model.encode_document(DOCUMENTS))


@pytest.mark.parametrize(
    "body, message",
    [
        ({"pool_factor": 0.5}, "pool_factor: Input should be greater than or equal to 1"),
        ({"pool_factor": "2"}, "pool_factor: Input should be a valid number"),
        ({"pool_factor": 2, "protected_tokens": -1}, "protected_tokens: Input should be greater"),
        ({"pool_factor": 2, "protected_tokens": 1.5}, "protected_tokens"),
    ],
)
def test_bad_pooling_options_are_422_naming_the_field(
    colbert: tuple[MultiVectorEncoder, TestClient], body: dict[str, Any], message: str
) -> None:
    _, client = colbert
    r = client.post("/embed_multi", json={"inputs": ["paris"], "input_type": "document", **body})
    assert r.status_code == 422, r.text
    assert message in r.json()["error"], r.text


def test_openapi_describes_the_pooling_fields(
    colbert: tuple[MultiVectorEncoder, TestClient],
) -> None:
    _, client = colbert
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    fields = schemas["EmbedMultiRequest"]["properties"]
    assert "HierarchicalTokenPooling" in str(fields["pool_factor"])
    assert "num_protected_tokens" in str(fields["protected_tokens"])


@pytest.mark.server
def test_real_server_pools_documents_as_sentence_transformers(
    start_server: Any, folders: dict[str, Path]
) -> None:
    server: ServerProcess = start_server(MODEL_ID=str(folders["colbert"]), LONG_INPUTS="truncate")
    server.wait_ready()
    model = MultiVectorEncoder(str(folders["colbert"]), device="cpu")
    for factor in (2, 4):
        r = server.post(
            "/embed_multi",
            json={"inputs": DOCUMENTS, "input_type": "document", "pool_factor": factor},
        )
        assert r.status_code == 200, r.text
        pooling = HierarchicalTokenPooling(pool_factor=factor)
        expected = model.encode_document(DOCUMENTS, token_pooling=pooling)
        assert_rows([np.asarray(d, dtype=np.float32) for d in r.json()], expected)
    r = server.post("/embed_multi", json={"inputs": "x", "input_type": "query", "pool_factor": 0})
    assert r.status_code == 422 and r.json()["error"].startswith("pool_factor: ")
