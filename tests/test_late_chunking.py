"""Late chunking on `/v1/embeddings` and `/embed` (`late_chunking: true`).

The reference is computed here with transformers alone on all-MiniLM-L6-v2 (`AutoModel`):
the chunks joined with single spaces, tokenized with offsets, each chunk's character span
mapped to the tokens whose span overlaps it, each chunk's vector the mean of those tokens'
rows of the last hidden state, then L2 (the folder normalizes). Long documents: the windows
the rule in `service.engine.forward.late` gives, each computed alone as [CLS] + its tokens +
[SEP], each chunk pooled from the window that holds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import app_client
from schema_check import validator
from starlette.testclient import TestClient

from service.engine.forward.late import plan, token_spans
from service.errors import InvalidInput

CHUNKS = [
    "Berlin is the capital and largest city of Germany.",
    "Its more than 3.85 million inhabitants make it the most populous city of the EU.",
    "The city is also one of the states of Germany.",
]


def reference_late(
    folder: Path, chunks: list[str], window: int | None = None, overlap: int = 0
) -> np.ndarray:
    """The chunks' late-chunked vectors [chunks, 384] with transformers alone; with `window`
    (tokens a window holds, [CLS] and [SEP] included), by the windows rule."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    text = " ".join(chunks)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    spans, at = [], 0
    for chunk in chunks:  # the tokens whose character span overlaps the chunk's
        hit = [j for j, (s, e) in enumerate(offsets) if e > s and s < at + len(chunk) and e > at]
        spans.append((hit[0], hit[-1] + 1))
        at += len(chunk) + 1
    size = (window or len(ids) + 2) - 2
    vectors: list[Any] = [None] * len(chunks)
    i = 0
    while i < len(chunks):  # each window: `overlap` tokens before its first chunk
        first, last = spans[i]
        start = max(0, first - overlap, last - size) if window else 0
        window_ids = [tok.cls_token_id, *ids[start : start + size], tok.sep_token_id]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([window_ids]))[0][0]
        while i < len(chunks) and spans[i][1] <= start + size:
            a, b = spans[i]
            vectors[i] = hidden[1 + a - start : 1 + b - start].mean(dim=0).numpy()
            i += 1
    matrix = np.stack(vectors)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


# -- the rule, without a model --------------------------------------------------------------
def test_token_spans_overlap_and_name_an_empty_chunk() -> None:
    offsets = [(0, 5), (6, 11), (11, 12), (13, 17)]  # "Hello world. Next"
    assert token_spans(offsets, [(0, 12), (13, 17)], shift=0) == [(0, 3), (3, 4)]
    assert token_spans(offsets, [(2, 14)], shift=1) == [(0, 4)]  # a prompt of 1 char
    with pytest.raises(InvalidInput) as caught:
        token_spans([(0, 5), (0, 0)], [(0, 5), (6, 7)], shift=0)
    assert caught.value.at == "[1]"


def test_plan_puts_each_chunk_whole_in_one_window_with_context() -> None:
    spans = [(0, 40), (40, 90), (90, 100), (100, 160), (160, 200)]
    assert plan(spans, 200, size=250, overlap=30) == [(0, [0, 1, 2, 3, 4])]
    windows = plan(spans, 200, size=100, overlap=30)
    assert windows == [(0, [0, 1, 2]), (70, [3]), (130, [4])]
    for start, held in windows:
        for k in held:
            assert start <= spans[k][0] and spans[k][1] <= start + 100
    # a chunk near a window's length gets less context, so that it fits whole
    assert plan([(0, 50), (50, 140)], 140, size=100, overlap=30) == [(0, [0]), (40, [1])]
    with pytest.raises(InvalidInput) as caught:
        plan([(0, 50), (50, 160)], 160, size=100, overlap=30)
    assert caught.value.at == "[1]"
    assert "110 tokens" in str(caught.value)


# -- in process -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model) as c:
        yield c


def test_openai_late_chunking_equals_transformers(client: TestClient, embedded_model: Path) -> None:
    r = client.post(
        "/v1/embeddings", json={"input": CHUNKS, "late_chunking": True, "encoding_format": "float"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    np.testing.assert_allclose(got, reference_late(embedded_model, CHUNKS), atol=2e-6)
    from transformers import AutoTokenizer

    tokens = len(AutoTokenizer.from_pretrained(embedded_model)(" ".join(CHUNKS))["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_late_chunks_differ_from_chunks_alone(client: TestClient) -> None:
    late = client.post("/embed", json={"inputs": CHUNKS, "late_chunking": True}).json()
    alone = client.post("/embed", json={"inputs": CHUNKS}).json()
    assert len(late) == len(alone) == 3
    cos = float(np.dot(late[1], alone[1]))
    assert 0.3 < cos < 0.999  # context changed "Its ... inhabitants", not beyond recognition


def test_embed_late_chunking_with_dimensions_and_normalize(
    client: TestClient, embedded_model: Path
) -> None:
    ref = reference_late(embedded_model, CHUNKS)
    r = client.post(
        "/embed",
        json={"inputs": CHUNKS, "late_chunking": True, "dimensions": 64, "normalize": True},
    )
    assert r.status_code == 200, r.text
    cut = ref[:, :64] / np.linalg.norm(ref[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(r.json()), cut, atol=2e-6)


def test_long_documents_are_windowed_by_the_rule(client: TestClient, embedded_model: Path) -> None:
    chunks = [f"Paragraph {i} tells how river number {i} crosses the old city." for i in range(60)]
    info = client.get("/info").json()["limits"]["late_chunking"]
    assert info == {"max_tokens": 16 * 256, "window_tokens": 256, "overlap_tokens": 64}
    r = client.post("/embed", json={"inputs": chunks, "late_chunking": True})
    assert r.status_code == 200, r.text
    ref = reference_late(embedded_model, chunks, window=256, overlap=64)
    np.testing.assert_allclose(np.array(r.json()), ref, atol=2e-6)


@pytest.mark.parametrize(
    "route, body, status, says",
    [
        ("/embed", {"inputs": ["a", "\u200b", "b"], "late_chunking": True}, 422, "inputs[1]:"),
        ("/v1/embeddings", {"input": ["a", "\u200b"], "late_chunking": True}, 422, "input[1]:"),
        (
            "/embed",
            {"inputs": ["a", "b"], "late_chunking": True, "truncate": True},
            422,
            "truncate",
        ),
        ("/embed", {"inputs": [[101, 102]], "late_chunking": True}, 422, "token ids"),
        ("/embed", {"inputs": ["a"], "late_chunking": "yes"}, 422, "late_chunking"),
        ("/embed", {"inputs": ["a " * 300], "late_chunking": True}, 422, "inputs[0]:"),
        ("/embed", {"inputs": ["word " * 250] * 20, "late_chunking": True}, 422, "at most 4096"),
        (
            "/v1/embeddings",
            {"input": ["a", "b"], "late_chunking": True, "encoding_format": "int8"},
            422,
            "int8",
        ),
    ],
)
def test_late_chunking_refusals(
    client: TestClient, route: str, body: dict[str, Any], status: int, says: str
) -> None:
    r = client.post(route, json=body)
    assert r.status_code == status, r.text
    assert says in r.text


def test_one_text_is_one_chunk_and_openapi_names_the_field(client: TestClient) -> None:
    one = client.post("/embed", json={"inputs": "A single chunk.", "late_chunking": True})
    plain = client.post("/embed", json={"inputs": "A single chunk."})
    assert one.status_code == 200
    # mean pooling without [CLS] and [SEP]: close to, not equal to, the plain vector
    assert 0.9 < float(np.dot(one.json()[0], plain.json()[0])) < 0.99999
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("EmbedRequest", "TextEmbeddingsRequest"):
        assert "late_chunking" in schema[name]["properties"], name


@pytest.mark.parametrize(
    ("route", "schema", "body", "status"),
    [
        ("/embed", "EmbedRequest", {"inputs": ["a", "b"], "late_chunking": True}, 200),
        ("/embed", "EmbedRequest", {"inputs": [[101, 102], [7]], "late_chunking": True}, 422),
        ("/embed", "EmbedRequest", {"inputs": [[101, 102], [7]], "late_chunking": False}, 200),
        ("/embed", "EmbedRequest", {"inputs": "a", "late_chunking": True, "truncate": True}, 422),
        (
            "/v1/embeddings",
            "TextEmbeddingsRequest",
            {"input": "a", "late_chunking": True, "encoding_format": "uint8"},
            422,
        ),
        (
            "/v1/embeddings",
            "TextEmbeddingsRequest",
            {"input": ["a", "b"], "late_chunking": True, "encoding_format": "base64"},
            200,
        ),
    ],
)
def test_the_document_says_what_late_chunking_takes(
    client: TestClient, route: str, schema: str, body: dict[str, Any], status: int
) -> None:
    """A body the document allows is answered; one it refuses is a 422 (fuzzers read it)."""
    document = client.get("/openapi.json").json()
    allowed = validator(document, schema).is_valid(body)
    assert allowed == (status == 200)
    r = client.post(route, json=body)
    assert r.status_code == status, r.text


# -- the real server --------------------------------------------------------------------------
@pytest.mark.server
def test_real_server_late_chunking_through_the_openai_client_and_embed(
    start_server: Any, embedded_model: Path
) -> None:
    """The openai SDK passes `late_chunking` in `extra_body`; /embed takes it as a field. Both
    equal the transformers reference, short and windowed."""
    import openai

    server = start_server(MODEL_ID=str(embedded_model))
    server.wait_ready()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model="any", input=CHUNKS, extra_body={"late_chunking": True})
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_allclose(got, reference_late(embedded_model, CHUNKS), atol=2e-6)
    assert answer.usage.prompt_tokens > sum(len(c.split()) for c in CHUNKS)
    long = [f"Chapter {i}: the harbour of town {i} was rebuilt after the storm." for i in range(50)]
    r = server.post("/embed", json={"inputs": long, "late_chunking": True})
    assert r.status_code == 200, r.text
    ref = reference_late(embedded_model, long, window=256, overlap=64)
    np.testing.assert_allclose(np.array(r.json()), ref, atol=2e-6)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.embeddings.create(
            model="any", input=["ok", "\u200b"], extra_body={"late_chunking": True}
        )
    assert "input[1]" in str(caught.value)
