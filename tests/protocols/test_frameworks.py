"""The frameworks people already run, against the real server with the embedded
all-MiniLM-L6-v2: LangChain (`langchain-openai`), LlamaIndex's TEI embeddings, Haystack's
Hugging Face API embedders (`text_embeddings_inference`). Each vector equals
SentenceTransformer.encode within the served backend's tolerance (`close_to`). One server for
the module (gunicorn on 127.0.0.1, a free port); the openai SDK and `InferenceClient` have
their own modules (test_openai.py, test_inference_client.py). Bulk requests as indexers send
them: LangChain's default chunk of 1,000 texts, 2,048 inputs (OpenAI's limit), 2,049.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import ServerProcess
from sentence_transformers import SentenceTransformer

from service.engine.loading.choice.quality import MIN_COSINE
from service.engine.loading.load import EMBEDDED_MODEL_NAME

pytestmark = pytest.mark.server

TEXTS = [
    "A man is playing a guitar.",
    "Someone plays the guitar on a small stage in the evening, and the crowd sings along.",
    "The stock market fell.",
    "Paris is the capital of France.",
]
QUERY = "who plays the guitar?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess({}, tmp_path_factory.mktemp("frameworks") / "server.log")
    try:
        process.wait_ready()
        yield process
    finally:
        assert process.terminate() == 0


@pytest.fixture(scope="module")
def served_dtypes(server: ServerProcess) -> set[str]:
    """The dtypes the server computes in (/info: the backend's, and small batches' if routed)."""
    backend = server.get("/info").json()["model"]["backend"]
    return {backend["dtype"], backend.get("small_batches", {}).get("dtype", backend["dtype"])}


@pytest.fixture(scope="module")
def st(embedded_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(embedded_model), device="cpu")


@pytest.fixture(scope="module")
def st_raw(st: SentenceTransformer) -> SentenceTransformer:
    """The same model without its Normalize module (what `normalize=false` answers)."""
    return SentenceTransformer(modules=[st[0], st[1]], device="cpu")


@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's clients refuse URLs while HF_HUB_OFFLINE is on in their own process
    (the server keeps it on)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")


def close_to(got: Any, want: Any, dtypes: set[str]) -> None:
    """`got` (rows of vectors) equals `want`: within 1e-4 per component when the server
    computes in float32 (torch or onnxruntime), else each row's cosine >= `MIN_COSINE`, the
    bar a reduced dtype passed to be chosen (service/engine/loading/choice/ranking.py)."""
    a = np.atleast_2d(np.asarray(got, dtype=np.float64))
    b = np.atleast_2d(np.asarray(want, dtype=np.float64))
    assert a.shape == b.shape
    if dtypes == {"float32"}:
        assert float(np.abs(a - b).max()) < 1e-4
    else:
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        assert float(cos.min()) >= MIN_COSINE


# -- LangChain --------------------------------------------------------------------------------
def test_langchain_openai_sends_text_and_equals_st(
    server: ServerProcess, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    """`check_embedding_ctx_length=False`: LangChain sends the texts themselves (by default it
    sends tiktoken ids, which are not this model's)."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=EMBEDDED_MODEL_NAME,
        base_url=f"{server.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embeddings.embed_documents(TEXTS)
    assert len(documents) == len(TEXTS) and len(documents[0]) == 384
    close_to(documents, st.encode(TEXTS), served_dtypes)
    close_to(embeddings.embed_query(QUERY), st.encode([QUERY]), served_dtypes)
    chunked = embeddings.embed_documents(TEXTS, chunk_size=3)  # two requests, in order
    close_to(chunked, st.encode(TEXTS), served_dtypes)
    both = asyncio.run(embeddings.aembed_documents(TEXTS))
    close_to(both, st.encode(TEXTS), served_dtypes)


def test_langchain_openai_dimensions(
    server: ServerProcess, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    """`dimensions=` cuts the vector and normalizes it again (OpenAI's reading)."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=EMBEDDED_MODEL_NAME,
        base_url=f"{server.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        dimensions=128,
    )
    cut = st.encode(TEXTS)[:, :128]
    close_to(
        embeddings.embed_documents(TEXTS),
        cut / np.linalg.norm(cut, axis=1, keepdims=True),
        served_dtypes,
    )


# -- LlamaIndex ---------------------------------------------------------------------------------
def test_llama_index_tei_embeddings_equal_st(
    server: ServerProcess, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    """`TextEmbeddingsInference` posts `{"inputs": [...], "truncate": true}` to /embed."""
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embed = TextEmbeddingsInference(
        model_name=EMBEDDED_MODEL_NAME, base_url=server.url, embed_batch_size=3, timeout=30
    )
    close_to(embed.get_text_embedding_batch(TEXTS), st.encode(TEXTS), served_dtypes)
    close_to(embed.get_query_embedding(QUERY), st.encode([QUERY]), served_dtypes)
    long = "The quick brown fox jumps over the lazy dog. " * 60  # over 256 tokens: cut
    close_to(embed.get_text_embedding(long), st.encode([long]), served_dtypes)
    close_to(asyncio.run(embed.aget_query_embedding(QUERY)), st.encode([QUERY]), served_dtypes)


# -- Haystack -----------------------------------------------------------------------------------
@pytest.mark.usefixtures("hub_online")
def test_haystack_text_embedder_equals_st(
    server: ServerProcess,
    st: SentenceTransformer,
    st_raw: SentenceTransformer,
    served_dtypes: set[str],
) -> None:
    """`HuggingFaceAPITextEmbedder` (text_embeddings_inference) posts to `/`; it sends
    `normalize=False` unless told otherwise, and then gets the unnormalized vector."""
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPITextEmbedder,
    )

    api = {"url": server.url}
    normalized = HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params=api, token=None, normalize=True
    )
    close_to(normalized.run(QUERY)["embedding"], st.encode([QUERY]), served_dtypes)
    default = HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params=api, token=None
    )
    raw = default.run(QUERY)["embedding"]
    close_to(raw, st_raw.encode([QUERY]), served_dtypes)
    assert np.linalg.norm(raw) > 1.5  # really not normalized


@pytest.mark.usefixtures("hub_online")
def test_haystack_document_embedder_equals_st(
    server: ServerProcess, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
    )

    embedder = HuggingFaceAPIDocumentEmbedder(
        api_type="text_embeddings_inference",
        api_params={"url": server.url},
        token=None,
        normalize=True,
        batch_size=3,
    )
    out = embedder.run([Document(content=t) for t in TEXTS])["documents"]
    assert [d.content for d in out] == TEXTS
    close_to([d.embedding for d in out], st.encode(TEXTS), served_dtypes)


# -- bulk: an indexer's chunks ---------------------------------------------------------------
def corpus(n: int) -> list[str]:
    return [
        f"passage {i} on topic {i % 37}, with a few more words {i * 7919 % 1000}" for i in range(n)
    ]


@pytest.fixture(scope="module")
def openai_client(server: ServerProcess) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_langchains_default_chunk_of_1000_is_one_request_in_order(
    server: ServerProcess, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    from langchain_openai import OpenAIEmbeddings

    texts = corpus(1000)
    embeddings = OpenAIEmbeddings(
        model=EMBEDDED_MODEL_NAME,
        base_url=f"{server.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
        request_timeout=300,
    )
    assert embeddings.chunk_size == 1000  # LangChain's default: one request here
    before = server.get("/metrics").text
    vectors = embeddings.embed_documents(texts)
    assert len(vectors) == 1000
    close_to(vectors[::8], st.encode(texts[::8]), served_dtypes)  # every 8th, in place
    assert requests_answered(server.get("/metrics").text) - requests_answered(before) == 1


def requests_answered(metrics_text: str) -> float:
    """`pipeline_server_requests_total` of /v1/embeddings with status 200."""
    line = next(
        (
            x
            for x in metrics_text.splitlines()
            if x.startswith("pipeline_server_requests_total{")
            and 'route="/v1/embeddings"' in x
            and 'status="200"' in x
        ),
        None,
    )
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def test_2048_inputs_answer_in_order_as_one_at_a_time_and_2049_name_the_limit(
    openai_client: Any, st: SentenceTransformer, served_dtypes: set[str]
) -> None:
    import openai

    texts = corpus(2048)
    out = openai_client.embeddings.create(model="x", input=texts, encoding_format="float")
    assert [d.index for d in out.data] == list(range(2048))
    got = [d.embedding for d in out.data]
    close_to(got[::16], st.encode(texts[::16]), served_dtypes)  # every 16th, in place
    for i in (0, 1, 777, 2047):  # the same input alone
        alone = openai_client.embeddings.create(model="x", input=texts[i], encoding_format="float")
        close_to(got[i], alone.data[0].embedding, served_dtypes)
    with pytest.raises(openai.APIStatusError) as over:
        openai_client.embeddings.create(model="x", input=[*texts, "one more"])
    assert over.value.status_code == 413
    assert "2049 inputs" in over.value.message and "MAX_CLIENT_BATCH_SIZE" in over.value.message


def test_a_one_input_request_is_not_queued_behind_a_bulk_one(
    server: ServerProcess, openai_client: Any
) -> None:
    """Sent while a bulk request's 1,000 inputs are queued, a one-input request is answered
    long before them: the batcher runs it in the next batch (docs/operations.md, Bulk
    requests)."""
    import threading

    done: dict[str, float] = {}
    started = time.monotonic()

    def bulk() -> None:
        openai_client.embeddings.create(model="x", input=corpus(1000))
        done["bulk"] = time.monotonic() - started

    indexer = threading.Thread(target=bulk)
    indexer.start()
    time.sleep(0.5)  # the bulk request is queued and running
    r = httpx.post(f"{server.url}/embed", json={"inputs": "who plays the guitar?"}, timeout=60)
    done["one"] = time.monotonic() - started
    indexer.join(300)
    assert r.status_code == 200
    assert done["one"] < 0.5 + 0.25 * (done["bulk"] - 0.5), done


def test_curl_d_with_a_json_request_is_read_as_json(server: ServerProcess) -> None:
    """`curl -d '{"inputs": "hi"}' localhost:8000/` sends the form content type: a JSON object
    with `inputs` is read as JSON whatever the type; other text stays the one input."""
    form = {"content-type": "application/x-www-form-urlencoded"}
    as_form = server.post("/", content=b'{"inputs": "hi"}', headers=form)
    as_json = server.post("/", json={"inputs": "hi"})
    assert as_form.status_code == as_json.status_code == 200
    assert as_form.json() == as_json.json()
    raw = server.post("/", content=b"hi", headers=form)
    assert raw.json() == as_json.json()  # the same text, as raw text
    braces = server.post("/", content=b'{"text": "hi"}', headers=form)
    assert braces.status_code == 200 and braces.json() != as_json.json()
