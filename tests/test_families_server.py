"""New families on the real server (gunicorn + uvicorn worker): InferenceClient on `POST /`,
the OpenAPI document of a SPLADE deployment and schemathesis on it (no 5xx, answers inside
the document), and `/embed_sparse` against TEI's schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_models import sentence_model, splade_model
from helpers import ServerProcess, schemathesis_finds_nothing
from schema_check import check_tei, validator
from sentence_transformers import SentenceTransformer, SparseEncoder

pytestmark = pytest.mark.server

FUZZ_ENV = {"MAX_CLIENT_BATCH_SIZE": "8", "TRUNCATE": "true", "TORCH_NUM_THREADS": "1"}
TEXTS = ["hello", "paris is the capital of france", "john lives in london " * 6]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-servers")
    return {
        "splade": splade_model(root / "splade", "max"),
        "labse": sentence_model(root / "labse", "bert", ("cls",), ((32, "Tanh"),)),
    }


@pytest.fixture(scope="module")
def servers(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("family-logs")
    started = {
        name: ServerProcess({**FUZZ_ENV, "MODEL_ID": str(folder)}, logs / f"{name}.log")
        for name, folder in folders.items()
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.terminate()


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    """InferenceClient for a URL (it refuses URLs while HF_HUB_OFFLINE is on in its process)."""
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return lambda server: InferenceClient(model=server.url, timeout=60)


def test_inference_client_reads_dense_and_sparse_answers(
    servers: dict[str, ServerProcess], folders: dict[str, Path], client: Any
) -> None:
    labse = SentenceTransformer(str(folders["labse"]), device="cpu").encode(TEXTS)
    got = client(servers["labse"]).feature_extraction(TEXTS)
    assert np.abs(np.asarray(got) - labse).max() < 1e-4
    splade = SparseEncoder(str(folders["splade"]), device="cpu")
    dense = splade.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    got = client(servers["splade"]).feature_extraction(TEXTS)  # the full vocabulary-wide vector
    assert got.shape == dense.shape and np.abs(got - dense).max() < 1e-4
    answer = servers["splade"].post("/embed_sparse", json={"inputs": TEXTS}).json()
    check_tei("EmbedSparseResponse", answer)


def test_splade_document_lists_its_routes(servers: dict[str, ServerProcess]) -> None:
    server = servers["splade"]
    doc = server.get("/openapi.json").json()
    assert {"/", "/embed_sparse", "/tokenize", "/decode"} <= set(doc["paths"])
    assert not {"/embed", "/embed_all", "/v1/embeddings", "/similarity"} & set(doc["paths"])
    answer = server.post("/embed_sparse", json={"inputs": "a b", "max_active_dims": 3}).json()
    validator(doc, "EmbedSparseResponse").validate(answer)
    assert len(answer[0]) == 3
    info = server.get("/info").json()["model"]
    assert info["sparse"] is True and info["modules"] == [
        "Transformer(fill-mask)",
        "SpladePooling(max, relu)",
    ]
    metrics = server.get("/metrics").text
    assert 'route="/embed_sparse"' in metrics


@pytest.mark.parametrize("name", ["splade", "labse"])
def test_schemathesis_finds_nothing(
    servers: dict[str, ServerProcess], name: str, tmp_path: Path
) -> None:
    """As `test_openapi.py` runs it: every operation, every check, 20 examples each, seeded."""
    schemathesis_finds_nothing(servers[name].url, tmp_path)
