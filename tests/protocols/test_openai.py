"""The openai SDK against the real server (`/v1/embeddings`, `/v1/models`) with the embedded
all-MiniLM-L6-v2: vectors equal SentenceTransformer.encode, usage the tokenizer's count,
errors the SDK's classes with our message (OpenAI's envelope)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from helpers import ServerProcess
from schema_check import check_tei
from sentence_transformers import SentenceTransformer

from service.engine.loading.load import EMBEDDED_MODEL_NAME

pytestmark = pytest.mark.server

KEY = "test-key"
TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell."]
TOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("openai") / "server.log"
    process = ServerProcess({"API_KEY": KEY}, log)
    try:
        process.wait_ready()
        yield process
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def st(embedded_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(embedded_model), device="cpu")


def tokens(st: SentenceTransformer, texts: list[str]) -> int:
    return sum(len(st.tokenizer(t)["input_ids"]) for t in texts)


def max_diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def test_default_encoding_is_base64_and_equals_st(
    client: openai.OpenAI, st: SentenceTransformer, server: ServerProcess
) -> None:
    out = client.embeddings.create(model="anything", input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in out.data] == [0, 1, 2]
    assert max_diff([d.embedding for d in out.data], st.encode(TEXTS)) < TOL
    assert out.model == EMBEDDED_MODEL_NAME
    assert out.usage.prompt_tokens == out.usage.total_tokens == tokens(st, TEXTS)
    # what went over the wire: base64 strings, valid against TEI's OpenAICompatResponse too
    raw = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": TEXTS[0], "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()
    check_tei("OpenAICompatResponse", raw)
    assert isinstance(raw["data"][0]["embedding"], str)


def test_float_and_base64_explicit(client: openai.OpenAI, st: SentenceTransformer) -> None:
    expected = st.encode(TEXTS[:1])[0]
    floats = client.embeddings.create(
        model=EMBEDDED_MODEL_NAME, input=TEXTS[0], encoding_format="float"
    )
    assert len(floats.data) == 1 and max_diff(floats.data[0].embedding, expected) < TOL
    b64 = client.embeddings.create(model="x", input=TEXTS[0], encoding_format="base64")
    encoded: Any = b64.data[0].embedding  # the SDK leaves an explicit base64 answer as is
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert decoded.shape == (384,) and max_diff(decoded, expected) < TOL


def test_token_ids_are_refused_and_dimensions(
    client: openai.OpenAI, st: SentenceTransformer
) -> None:
    """Token ids are OpenAI's tiktoken ids by the API's definition, not this model's: 422 by
    default, in the SDK's class, naming LangChain's fix ([9906, 1917] is "Hello world" in
    cl100k_base, and two valid ids of BERT's vocabulary: a vector would mean nothing).
    OPENAI_TOKEN_IDS=model is tested in test_token_ids.py."""
    ids = [st.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    expected = st.encode(TEXTS[:2])
    for given in ([9906, 1917], ids):
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.embeddings.create(model="text-embedding-ada-002", input=given)
        assert "check_embedding_ctx_length=False" in refused.value.message
        assert "OPENAI_TOKEN_IDS=model" in refused.value.message
    cut = client.embeddings.create(model="x", input=TEXTS[0], dimensions=64)
    vector = np.asarray(cut.data[0].embedding)
    assert vector.shape == (64,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    assert max_diff(vector, expected[0][:64] / np.linalg.norm(expected[0][:64])) < TOL


def test_models_list(client: openai.OpenAI) -> None:
    [card] = client.models.list().data
    assert card.id == EMBEDDED_MODEL_NAME and card.object == "model"
    assert card.owned_by == "pipeline-server" and card.created > 0


def test_errors_are_the_sdks(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as empty:
        client.embeddings.create(model="x", input="")
    assert isinstance(empty.value.body, dict)
    assert empty.value.body["message"] == "input is empty; send some text"
    assert empty.value.code == "422" and empty.value.type == "invalid_input"
    with pytest.raises(openai.APIStatusError) as many:
        client.embeddings.create(model="x", input=["a"] * 2049)  # OpenAI's limit is 2,048
    assert many.value.status_code == 413 and "MAX_CLIENT_BATCH_SIZE" in many.value.message
    assert "2048" in many.value.message
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions 385"):
        client.embeddings.create(model="x", input="a", dimensions=385)
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        wrong.embeddings.create(model="x", input="a")
    r = httpx.post(f"{server.url}/v1/embeddings", json={"input": "a"})  # no key
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.headers["x-request-id"]
    r = httpx.get(f"{server.url}/v1/nothing", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and "message" in r.json()["error"]


def test_deadline_and_retry_after(server: ServerProcess) -> None:
    r = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": "a"},
        headers={"Authorization": f"Bearer {KEY}", "X-Request-Timeout": "0.000001"},
    )
    assert r.status_code in (503, 504), r.text
    assert "message" in r.json()["error"]
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) >= 1


def test_a_full_batch_in_order(client: openai.OpenAI, st: SentenceTransformer) -> None:
    """64 inputs (two of the engine's batches) in one call, in order."""
    texts = [f"sentence number {i}" for i in range(64)]
    out = client.embeddings.create(model="x", input=texts, encoding_format="float")
    assert [d.index for d in out.data] == list(range(64))
    assert max_diff([d.embedding for d in out.data], st.encode(texts)) < TOL
