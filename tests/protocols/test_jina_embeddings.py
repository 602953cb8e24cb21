"""Jina's embeddings API fields on `/v1/embeddings`, as its clients send them: `task`,
`embedding_type`, `normalized`, `truncate` (and `late_chunking`, `tests/test_late_chunking.py`).

In process on the embedded all-MiniLM-L6-v2 and on a tiny seeded folder with prompts, against
`SentenceTransformer.encode` (with the prompt each task maps to) and `quantize_embeddings`; then
Chroma's own `JinaEmbeddingFunction` (in its venv, `tests/reference_venv.py`) pointed at the
real server, its vectors against `encode` and the server's late-chunked answer.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from family_models import sentence_model
from helpers import ServerProcess, app_client
from reference_venv import CHROMA, ReferenceUnavailable, reference_python, run_reference
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from starlette.testclient import TestClient

TOL = 1e-4
TEXTS = ["paris is the capital of france", "john lives in london", "a big city on a river"]
PROMPTS = {"retrieval.query": "Represent the query: ", "query": "q: ", "document": "passage: "}
LONG = "The quick brown fox jumps over the lazy dog. " * 60  # about 600 tokens
# What each client sends by default (the texts aside): Chroma's JinaEmbeddingFunction and
# langchain4j's JinaEmbeddingModel the model's name alone; langchain-jina's LateChunkEmbeddings
# every field, `dimensions` 1024 (jina-embeddings-v3's width) unless told.
CHROMA_BODY = {"model": "jina-embeddings-v2-base-en"}
LANGCHAIN_QUERY = {
    "model": "jina-embeddings-v3",
    "late_chunking": False,
    "dimensions": 1024,
    "task": "retrieval.query",
    "embedding_type": "float",
}


@pytest.fixture(scope="module")
def client(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model) as c:
        yield c


@pytest.fixture(scope="module")
def st(embedded_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(embedded_model), device="cpu")


@pytest.fixture(scope="module")
def prompted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jina")
    return sentence_model(root / "prompted", "bert", ("mean",), prompts=PROMPTS)


def vectors(client: TestClient, body: dict[str, Any]) -> np.ndarray:
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]])


def refusal(client: TestClient, body: dict[str, Any]) -> str:
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 422, r.text
    return str(r.json()["error"]["message"])


def test_each_clients_default_body_equals_encode(
    client: TestClient, st: SentenceTransformer
) -> None:
    expected = st.encode(TEXTS)
    assert np.abs(vectors(client, {**CHROMA_BODY, "input": TEXTS}) - expected).max() < TOL
    # langchain-jina's query, with dimensions set to the model's width; its 1024 is refused
    one = vectors(client, {**LANGCHAIN_QUERY, "dimensions": 384, "input": TEXTS[:1]})
    assert np.abs(one - expected[:1]).max() < TOL
    message = refusal(client, {**LANGCHAIN_QUERY, "input": TEXTS[:1]})
    assert message.startswith("dimensions 1024 is more than the 384 dimensions")


def test_embedding_type_is_the_encoding_of_that_name(
    client: TestClient, st: SentenceTransformer
) -> None:
    expected = st.encode(TEXTS)
    for kind in ("binary", "ubinary"):
        got = vectors(client, {"input": TEXTS, "embedding_type": kind})
        assert (got == quantize_embeddings(expected, precision=kind)).all()
    r = client.post("/v1/embeddings", json={"input": TEXTS[0], "embedding_type": "base64"})
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.abs(raw - expected[0]).max() < TOL
    both = {"input": TEXTS[0], "embedding_type": "binary", "encoding_format": "float"}
    assert np.abs(vectors(client, both)[0] - expected[0]).max() < TOL  # OpenAI's field wins


def test_normalized_false_is_the_pooled_vector(client: TestClient, st: SentenceTransformer) -> None:
    pooled = SentenceTransformer(modules=[st[0], st[1]], device="cpu").encode(TEXTS)
    got = vectors(client, {"input": TEXTS, "normalized": False})
    assert np.abs(got - pooled).max() < 1e-3 and np.linalg.norm(got[0]) > 1.5
    unit = vectors(client, {"input": TEXTS, "normalized": True})
    assert np.abs(unit - st.encode(TEXTS)).max() < TOL


def test_truncate_cuts_or_refuses(client: TestClient, st: SentenceTransformer) -> None:
    got = vectors(client, {"input": LONG, "truncate": True})
    assert np.abs(got[0] - st.encode(LONG)).max() < TOL  # encode cuts at max_seq_length
    assert "256" in refusal(client, {"input": LONG, "truncate": False})


@pytest.mark.parametrize(
    ("task", "prompt"),
    [
        ("retrieval.query", "Represent the query: "),  # the folder's prompt of that name
        ("retrieval.passage", "passage: "),  # encode_document's prompt
        ("code.query", "q: "),  # encode_query's prompt
        ("text-matching", ""),
        ("classification", ""),  # the folder has no such prompt: the plain text
        ("document", "passage: "),  # a prompt of the folder, by its name
    ],
)
def test_task_is_its_prompt(prompted: Path, task: str, prompt: str) -> None:
    st = SentenceTransformer(str(prompted), device="cpu")
    with app_client(prompted) as c:
        got = vectors(c, {"input": TEXTS, "task": task})
        assert np.abs(got - st.encode(TEXTS, prompt=prompt)).max() < TOL
        if task == "retrieval.query":
            plain = vectors(c, {"input": TEXTS})
            assert np.abs(plain - st.encode(TEXTS, prompt="")).max() < TOL
            message = refusal(c, {"input": TEXTS, "task": "retrieval"})
            assert message.startswith("task 'retrieval' is not one of Jina's tasks")


def test_what_cannot_be_honoured_is_422_naming_the_field(client: TestClient) -> None:
    assert "embedding_type" in refusal(client, {"input": "a", "embedding_type": "int8"})
    late = {"input": ["a", "b"], "late_chunking": True, "truncate": True}
    assert refusal(client, late).startswith("truncate does not combine with late_chunking")
    assert "normalized" in refusal(client, {"input": "a", "normalized": "yes"})


def test_openapi_describes_the_jina_fields(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    body = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[1]
    fields = doc["components"]["schemas"][ref]["properties"]
    assert {"task", "embedding_type", "normalized", "truncate", "late_chunking"} <= set(fields)
    kinds = fields["embedding_type"]["anyOf"][0]["enum"]
    assert kinds == ["float", "base64", "binary", "ubinary"]


@pytest.mark.server
def test_chroma_jina_embedding_function(
    st: SentenceTransformer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Chroma's client, its API URL pointed at the real server: a collection's documents
    late-chunked (`late_chunking`), its queries with `task` retrieval.query."""
    try:
        python = reference_python(CHROMA)
    except ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    server = ServerProcess({}, tmp_path / "server.log")
    try:
        server.wait_ready()
        url = f"{server.url}/v1/embeddings"
        options = {"late_chunking": True, "query_config": {"task": "retrieval.query"}}
        got = run_reference(
            python,
            Path(__file__).parents[1] / "chroma_jina_reference.py",
            {"url": url, "texts": TEXTS, "options": options},
        )
        late = httpx.post(url, json={"input": TEXTS, "late_chunking": True}, timeout=30).json()
    finally:
        server.terminate()
    expected_late = np.asarray([d["embedding"] for d in late["data"]])
    assert np.abs(np.asarray(got["documents"]) - expected_late).max() < TOL
    # the query config keeps late_chunking (Chroma overwrites only what it names)
    assert np.abs(np.asarray(got["queries"]) - expected_late).max() < TOL
    assert np.abs(expected_late - st.encode(TEXTS)).max() > 0.05  # not the texts alone
