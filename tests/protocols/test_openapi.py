"""/openapi.json: the served routes of each deployment, their error answers, answers valid
against the document's own schemas, 503 while loading, and schemathesis on the real server
(an embedding deployment and a cross-encoder one with an API key)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ServerProcess, schemathesis_finds_nothing
from schema_check import validator
from starlette.testclient import TestClient

from service.app import create_app
from service.engine.loading.load import load_engine
from service.settings import Settings

pytestmark = pytest.mark.server

KEY = "k"
ENCODINGS = ["float", "base64", "int8", "uint8", "binary", "ubinary"]
OWN = {"/readyz", "/livez", "/metrics", "/info", "/openapi.json", "/v1/models"}
# Small batches and one torch thread keep each fuzzing run short on 2 shared cores (two torch
# threads on busy cores took ~0.8 s for a 3-token batch here, 10x the run); truncation keeps long
# generated strings valid (the document cannot say "at most 256 tokens" of a string).
FUZZ_ENV = {"MAX_CLIENT_BATCH_SIZE": "8", "TRUNCATE": "true", "TORCH_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, cross_encoder_model: Path
) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("openapi")
    started = {
        "embedding": ServerProcess(FUZZ_ENV, logs / "embedding.log"),
        "cross-encoder": ServerProcess(
            {**FUZZ_ENV, "MODEL_ID": str(cross_encoder_model), "API_KEY": KEY},
            logs / "cross-encoder.log",
        ),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.terminate()


def document(server: ServerProcess) -> dict[str, Any]:
    r = server.get("/openapi.json")  # public: no key needed
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc: dict[str, Any] = r.json()
    assert doc["openapi"] == "3.1.0"
    return doc


def test_each_deployment_lists_its_routes(servers: dict[str, ServerProcess]) -> None:
    embedding = document(servers["embedding"])
    assert set(embedding["paths"]) == OWN | {
        "/",
        "/embed",
        "/embed_all",
        "/similarity",
        "/tokenize",
        "/decode",
        "/v1/embeddings",
        "/v2/embed",
    }
    cross = document(servers["cross-encoder"])
    assert set(cross["paths"]) == OWN | {
        "/", "/predict", "/rerank", "/tokenize", "/decode", "/v1/rerank", "/v2/rerank"
    }  # fmt: skip
    assert cross["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer"}
    }
    # deployment values filled in: the batch bound, the vocabulary, the width
    embed = embedding["components"]["schemas"]["EmbedRequest"]["properties"]
    assert embed["dimensions"]["anyOf"][0] == {"minimum": 1, "maximum": 384, "type": "integer"}
    assert embed["inputs"]["anyOf"][2]["maxItems"] == 8
    sim = embedding["components"]["schemas"]["SimilarityInputs"]["properties"]["sentences"]
    assert sim["maxItems"] == 7  # the source sentence counts


def test_every_operation_lists_its_errors(servers: dict[str, ServerProcess]) -> None:
    for name, server in servers.items():
        doc = document(server)
        for path, item in doc["paths"].items():
            for method, op in item.items():
                responses = op["responses"]
                assert "200" in responses and "500" in responses, (path, method)
                if method == "post":
                    expected = {"400", "413", "415", "422", "503", "504"}
                    if name == "cross-encoder":
                        expected.add("401")
                        assert op["security"] == [{"bearer": []}]
                    assert expected <= set(responses), (path, sorted(responses))
                    schema = responses["422"]["content"]["application/json"]["schema"]["$ref"]
                    envelope = {"/v1/": "OpenAIErrorResponse", "/v2/": "CohereError"}.get(
                        path[:4], "ErrorResponse"
                    )
                    assert schema.endswith(envelope), path
                if "503" in responses and path != "/livez":  # a dead thread: no retry time
                    assert responses["503"]["headers"]["Retry-After"]["required"] is True


def test_answers_match_the_documents_schemas(servers: dict[str, ServerProcess]) -> None:
    emb, cross = servers["embedding"], servers["cross-encoder"]
    cases = [
        (emb, "/", {"inputs": ["a", "b"]}, "FeatureExtractionAnswer"),
        (emb, "/embed", {"inputs": "a"}, "EmbedResponse"),
        (emb, "/embed_all", {"inputs": ["a", [101, 102]]}, "EmbedAllResponse"),
        (
            emb,
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
            "SimilarityResponse",
        ),
        (emb, "/tokenize", {"inputs": "a b"}, "TokenizeResponse"),
        (emb, "/decode", {"ids": [[101, 102]]}, "DecodeResponse"),
        (
            emb,
            "/v1/embeddings",
            {"input": ["a"], "encoding_format": "base64"},
            "EmbeddingsResponse",
        ),
        (emb, "/v2/embed", {"texts": ["a"], "embedding_types": ENCODINGS}, "CohereEmbedResponse"),
        (emb, "/embed", {"inputs": ""}, "ErrorResponse"),
        (emb, "/v1/embeddings", {"input": ""}, "OpenAIErrorResponse"),
        (emb, "/v2/embed", {"texts": []}, "CohereError"),
        (cross, "/", {"inputs": {"text": "a", "text_pair": "b"}}, "TextClassificationAnswer"),
        (cross, "/predict", {"inputs": [["a"], ["a", "b"]]}, "PredictResponse"),
        (
            cross,
            "/rerank",
            {"query": "q", "texts": ["a", "b"], "return_text": True},
            "RerankResponse",
        ),
        (cross, "/v2/rerank", {"query": "q", "documents": ["a", "b"]}, "CohereRerankResponse"),
        (cross, "/v1/rerank", {"query": "q", "documents": ["a", "b"]}, "RerankDocumentsResponse"),
        (cross, "/v1/rerank", {"query": "q", "documents": []}, "OpenAIErrorResponse"),
    ]
    docs = {id(s): document(s) for s in (emb, cross)}
    for server, path, body, schema in cases:
        headers = {"Authorization": f"Bearer {KEY}"} if server is cross else {}
        answer = server.post(path, json=body, headers=headers).json()
        validator(docs[id(server)], schema).validate(answer)
    models = emb.get("/v1/models").json()
    validator(docs[id(emb)], "ModelList").validate(models)


@pytest.mark.parametrize("name", ["embedding", "cross-encoder"])
def test_schemathesis_finds_nothing(
    servers: dict[str, ServerProcess], name: str, tmp_path: Path
) -> None:
    """Every operation, every check: no 5xx, no answer outside the document, valid data
    accepted and invalid data refused. Bounded: 20 examples per operation, a fixed seed (the
    same cases each run), one worker; about 10 s each here."""
    server = servers[name]
    headers = [f"Authorization: Bearer {KEY}"] if name == "cross-encoder" else []
    schemathesis_finds_nothing(server.url, tmp_path, *headers, timeout_s=240)


def _retrieval_folder(kind: str, folder: Path) -> Path:
    from m3_models import m3_model
    from retrieval_models import multi_vector_model
    from static_models import static_model

    if kind == "bge-m3":
        return m3_model(folder)
    if kind == "multi-vector":
        return multi_vector_model(folder, token_pooling={"pool_factor": 2})
    return static_model(folder)


@pytest.mark.parametrize("kind", ["bge-m3", "multi-vector", "static"])
def test_schemathesis_finds_nothing_on_retrieval_models(kind: str, tmp_path: Path) -> None:
    """The same run on the families with routes and options of their own: /embed_hybrid, token
    pooling and MaxSim on every rerank route, and a static embedding model."""
    folder = _retrieval_folder(kind, tmp_path / kind)
    server = ServerProcess({**FUZZ_ENV, "MODEL_ID": str(folder)}, tmp_path / "server.log")
    try:
        server.wait_ready()
        schemathesis_finds_nothing(server.url, tmp_path, timeout_s=240)
    finally:
        server.terminate()


def test_503_while_the_model_loads(cross_encoder_model: Path) -> None:
    gate = threading.Event()

    def slow_load(settings: Settings) -> Any:
        gate.wait(60)
        return load_engine(settings)

    app = create_app(Settings(model_id=str(cross_encoder_model)), engine_factory=slow_load)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            for path in ("/openapi.json", "/v1/models"):
                r = client.get(path)
                assert r.status_code == 503 and r.headers["retry-after"] == "5", path
            assert "message" in client.get("/v1/models").json()["error"]
            r = client.post("/predict", json={"inputs": "a"})
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            gate.set()
    finally:
        gate.set()


def test_openapi_is_public_but_routes_need_the_key(servers: dict[str, ServerProcess]) -> None:
    cross = servers["cross-encoder"]
    assert cross.get("/openapi.json").status_code == 200
    assert cross.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 401
    assert httpx.get(f"{cross.url}/v1/models", timeout=10).status_code == 401
