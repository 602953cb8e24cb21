"""Token ids on `/v1/embeddings`: OpenAI's API defines them as tiktoken ids, never this model's.
Refused by default (422 saying so and naming LangChain's `check_embedding_ctx_length=False`);
`OPENAI_TOKEN_IDS=model` reads them as the model's own ids (ids outside its vocabulary still
422). TEI's `/embed` reads the model's own ids either way. In process, the embedded model; the
openai SDK's view of the refusal is in test_openai.py (real server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import app_client
from sentence_transformers import SentenceTransformer
from starlette.testclient import TestClient

from service.settings import Settings

TEXTS = ["A man is playing a guitar.", "Stocks fell."]
CL100K_HELLO_WORLD = [9906, 1917]  # "Hello world" in OpenAI's cl100k_base: valid BERT ids too


@pytest.fixture(scope="module")
def st(embedded_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(embedded_model), device="cpu")


@pytest.fixture(scope="module")
def ids(st: SentenceTransformer) -> list[list[int]]:
    """The model's own ids of TEXTS, special tokens included (as sentence-transformers adds)."""
    return [st.tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def refusing(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model) as client:
        yield client


@pytest.fixture(scope="module")
def model_ids(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model, openai_token_ids="model") as client:
        yield client


def vectors(answer: Any) -> np.ndarray:
    return np.asarray([d["embedding"] for d in answer["data"]], dtype=np.float64)


def test_the_default_refuses_token_ids_saying_why(
    refusing: TestClient, ids: list[list[int]]
) -> None:
    assert Settings().openai_token_ids == "refuse"
    for body in (
        {"input": CL100K_HELLO_WORLD},
        {"input": [CL100K_HELLO_WORLD, CL100K_HELLO_WORLD]},
        {"input": ["some text", ids[0]]},
        {"input": ids[0], "model": "text-embedding-ada-002"},
    ):
        r = refusing.post("/v1/embeddings", json=body)
        assert r.status_code == 422, (body, r.text)
        message = r.json()["error"]["message"]
        assert "OpenAI's tiktoken ids" in message
        assert "check_embedding_ctx_length=False" in message
        assert "OPENAI_TOKEN_IDS=model" in message
    assert refusing.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200


def test_tei_routes_read_the_models_own_ids_by_default(
    refusing: TestClient, st: SentenceTransformer, ids: list[list[int]]
) -> None:
    r = refusing.post("/embed", json={"inputs": ids})
    assert r.status_code == 200, r.text
    assert np.abs(np.asarray(r.json()) - st.encode(TEXTS)).max() < 1e-4


def test_model_mode_reads_the_models_own_ids(
    model_ids: TestClient, st: SentenceTransformer, ids: list[list[int]]
) -> None:
    r = model_ids.post("/v1/embeddings", json={"input": ids, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    assert np.abs(vectors(r.json()) - st.encode(TEXTS)).max() < 1e-4
    assert r.json()["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    mixed = model_ids.post("/v1/embeddings", json={"input": [TEXTS[0], ids[1]]})
    assert mixed.status_code == 200
    outside = model_ids.post("/v1/embeddings", json={"input": [101, 30522, 102]})
    assert outside.status_code == 422
    assert "outside this model's vocabulary (0..30521)" in outside.json()["error"]["message"]


def test_the_document_shows_token_ids_only_where_they_are_read(
    refusing: TestClient, model_ids: TestClient
) -> None:
    def input_schema(client: TestClient) -> str:
        doc = client.get("/openapi.json").json()
        ref = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
        name = ref["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        return str(doc["components"]["schemas"][name]["properties"]["input"])

    assert "integer" not in input_schema(refusing)
    assert "integer" in input_schema(model_ids) and "30521" in input_schema(model_ids)
