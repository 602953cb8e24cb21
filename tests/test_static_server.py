"""A static embedding model on the real server (gunicorn + uvicorn worker): the openai SDK on
/v1/embeddings (float and its default base64), TEI's /embed and the shed and deadline answers,
compared with `SentenceTransformer(folder).encode`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import ServerProcess
from sentence_transformers import SentenceTransformer
from static_models import static_model

pytestmark = pytest.mark.server

TEXTS = ["hello", "paris is the capital of france.", "john lives in london " * 20]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return static_model(tmp_path_factory.mktemp("static-server") / "model")


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("static-logs") / "server.log"
    proc = ServerProcess({"MODEL_ID": str(folder), "TORCH_NUM_THREADS": "1"}, log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.terminate()


def test_openai_sdk_reads_the_static_model_as_encode_answers(
    server: ServerProcess, folder: Path
) -> None:
    from openai import OpenAI

    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    default = client.embeddings.create(model="model", input=TEXTS)  # base64 on the wire
    floats = client.embeddings.create(model="model", input=TEXTS, encoding_format="float")
    for answer in (default, floats):
        assert np.allclose([d.embedding for d in answer.data], want, atol=1e-5)
    assert default.model == "model" and default.usage.prompt_tokens > len(TEXTS)
    cut = client.embeddings.create(model="model", input=TEXTS[:1], dimensions=4)
    assert len(cut.data[0].embedding) == 4


def test_tei_route_deadline_and_errors_on_the_real_server(
    server: ServerProcess, folder: Path
) -> None:
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    tei = server.post("/embed", json={"inputs": TEXTS})
    assert tei.status_code == 200 and np.allclose(tei.json(), want, atol=1e-5)
    assert tei.headers["x-request-id"]
    rows = server.post("/embed_all", json={"inputs": "hello"})
    assert rows.status_code == 424 and rows.json()["error_type"] == "wrong_task"
    late = server.post("/embed", json={"inputs": TEXTS, "late_chunking": True})
    assert late.status_code == 422 and "late_chunking" in late.json()["error"]
    info = server.get("/info").json()["model"]
    assert info["static"]["dimension"] == 16 and info["max_input_tokens"] is None
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'route="/embed"' in metrics and 'route="/v1/embeddings"' in metrics
