"""The `cohere` SDK (`ClientV2`) against the real server, and the Jina/vLLM `/v1/rerank` over
plain HTTP: a tiny seeded embedding folder with query, document and classification prompts
(and `query` as its default), and the tests' tiny cross-encoder.

Floats equal `SentenceTransformer.encode` with the prompt each input type maps to; base64 is
their bytes; binary/ubinary are `quantize_embeddings`' packings exactly; int8/uint8 its codes
with the ranges of the packaged calibration set; rerank scores equal `CrossEncoder.predict`
within 1e-4, in the same order. Bad input is a 4xx in each dialect's error shape.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from cohere.core.api_error import ApiError
from family_models import sentence_model
from helpers import ServerProcess
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.util import quantize_embeddings

from service.engine.pooling.calibration import read_set

pytestmark = pytest.mark.server

TOL = 1e-4
TEXTS = ["paris is the capital of france", "john lives in london", "a big city on a river"]
PROMPTS = {"query": "query: ", "document": "passage: ", "classification": "classify: "}
# input_type -> the prompt `encode` gets: the folder's, else none (not the default prompt)
BY_INPUT_TYPE = {
    "search_query": "query: ",
    "search_document": "passage: ",
    "classification": "classify: ",
    "clustering": "",
}
QUERY = "which city is the capital of france"
DOCUMENTS = [
    "berlin is the capital of germany",
    "paris is the capital of france",
    "john works at acme on monday",
    "rome is a big city in italy",
    "the river in paris",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cohere")
    return sentence_model(
        root / "prompted", "bert", ("mean",), prompts=PROMPTS, default_prompt_name="query"
    )


@pytest.fixture(scope="module")
def servers(
    folder: Path, cross_encoder_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("cohere-logs")
    started = {
        "embed": ServerProcess({"MODEL_ID": str(folder)}, logs / "embed.log"),
        "rerank": ServerProcess({"MODEL_ID": str(cross_encoder_model)}, logs / "rerank.log"),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.terminate()


def client(server: ServerProcess) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=server.url, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def st(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def ranges(st: SentenceTransformer) -> np.ndarray:
    """int8 ranges as the server calibrates them: the packaged texts, the default prompt."""
    vectors = np.asarray(st.encode(list(read_set().texts)))
    return np.stack([vectors.min(axis=0), vectors.max(axis=0)])


def encode(st: SentenceTransformer, texts: list[str], prompt: str, **kw: Any) -> np.ndarray:
    return np.asarray(st.encode(texts, prompt=prompt, **kw))


def max_diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def assert_codes(got: Any, expected: np.ndarray) -> None:
    """Equal, but for a float32 rounding across a bucket edge (one step, rarely)."""
    diff = np.abs(np.asarray(got, dtype=np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02, diff


# -- /v2/embed ---------------------------------------------------------------------------------
def test_every_embedding_type(
    servers: dict[str, ServerProcess], st: SentenceTransformer, ranges: np.ndarray
) -> None:
    out = client(servers["embed"]).embed(
        model="prompted",
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "int8", "uint8", "binary", "ubinary", "base64"],
    )
    expected = encode(st, TEXTS, "passage: ")
    e = out.embeddings
    assert max_diff(e.float_, expected) < TOL
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in e.base64 or []]
    assert (np.asarray(decoded) == np.asarray(e.float_, dtype=np.float32)).all()  # same bits
    for name in ("binary", "ubinary"):
        assert (np.asarray(getattr(e, name)) == quantize_embeddings(expected, name)).all(), name
    for name in ("int8", "uint8"):
        assert_codes(getattr(e, name), quantize_embeddings(expected, name, ranges=ranges))
    assert (np.asarray(e.uint8) == np.asarray(e.int8) + 128).all()
    assert out.response_type == "embeddings_by_type" and out.id and out.texts == TEXTS
    assert out.meta is not None and out.meta.billed_units is not None
    tokens = sum(len(st.tokenizer("passage: " + t)["input_ids"]) for t in TEXTS)
    assert out.meta.billed_units.input_tokens == tokens


@pytest.mark.parametrize("input_type", list(BY_INPUT_TYPE))
def test_each_input_type_is_its_prompt(
    servers: dict[str, ServerProcess], st: SentenceTransformer, input_type: str
) -> None:
    out = client(servers["embed"]).embed(model="m", texts=TEXTS, input_type=input_type)
    assert out.embeddings.float_ is not None and out.embeddings.int8 is None  # float: default
    assert max_diff(out.embeddings.float_, encode(st, TEXTS, BY_INPUT_TYPE[input_type])) < TOL


def test_output_dimension_cuts_then_normalizes(
    servers: dict[str, ServerProcess], st: SentenceTransformer, ranges: np.ndarray
) -> None:
    out = client(servers["embed"]).embed(
        model="m",
        texts=TEXTS,
        input_type="search_query",
        output_dimension=8,
        embedding_types=["float", "int8", "ubinary"],
    )
    expected = encode(st, TEXTS, "query: ", truncate_dim=8, normalize_embeddings=True)
    assert max_diff(out.embeddings.float_, expected) < TOL
    norms = np.linalg.norm(np.asarray(out.embeddings.float_), axis=1)
    assert max_diff(norms, np.ones(3)) < 1e-5
    calibration = np.asarray(st.encode(list(read_set().texts), truncate_dim=8))
    calibration /= np.linalg.norm(calibration, axis=1, keepdims=True)
    cut_ranges = np.stack([calibration.min(axis=0), calibration.max(axis=0)])
    assert_codes(out.embeddings.int8, quantize_embeddings(expected, "int8", ranges=cut_ranges))
    assert (np.asarray(out.embeddings.ubinary) == quantize_embeddings(expected, "ubinary")).all()


def test_truncate_and_max_tokens(
    servers: dict[str, ServerProcess], st: SentenceTransformer
) -> None:
    """Every word here is one token of the tiny vocabulary, so a cut is a list of words."""
    co = client(servers["embed"])
    limit = servers["embed"].get("/info").json()["model"]["max_input_tokens"]
    words = ["paris", "is", "the", "capital", "of", "france"] * 40  # 240 tokens: past the limit
    long = " ".join(words)
    with pytest.raises(ApiError) as refused:
        co.embed(model="m", texts=[long], input_type="clustering", truncate="NONE")
    assert refused.value.status_code == 422
    assert f"at most {limit} tokens" in refused.value.body["message"]
    kept = limit - 2  # [CLS] and [SEP]
    end = co.embed(model="m", texts=[long], input_type="clustering")  # END: Cohere's default
    start = co.embed(model="m", texts=[long], input_type="clustering", truncate="START")
    assert end.meta is not None and end.meta.billed_units is not None
    assert end.meta.billed_units.input_tokens == limit
    assert max_diff(end.embeddings.float_, encode(st, [" ".join(words[:kept])], "")) < TOL
    assert max_diff(start.embeddings.float_, encode(st, [" ".join(words[-kept:])], "")) < TOL
    short = co.embed(model="m", texts=[TEXTS[0]], input_type="clustering", max_tokens=2)
    assert max_diff(short.embeddings.float_, encode(st, ["paris is"], "")) < TOL  # its 2 tokens
    with pytest.raises(ApiError) as over:
        co.embed(
            model="m", texts=[TEXTS[0]], input_type="clustering", max_tokens=2, truncate="NONE"
        )
    assert over.value.status_code == 422 and "max_tokens 2" in over.value.body["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"texts": ["a"], "embedding_types": ["int4"]}, "embedding_types[0]"),
        ({"texts": ["a"], "output_dimension": 0}, "output_dimension"),
        ({"texts": ["a"], "output_dimension": 33}, "more than the 32 dimensions"),
        ({"texts": []}, "texts is an empty list"),
        ({"texts": ["a", " "]}, "texts[1] is empty"),
        ({"texts": ["a"], "input_type": "image"}, "input_type"),
        ({"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "unknown field(s) images"),
    ],
)
def test_bad_embed_requests_are_4xx_in_cohere_shape(
    servers: dict[str, ServerProcess], body: dict[str, Any], message: str
) -> None:
    r = servers["embed"].post("/v2/embed", json=body)
    assert r.status_code == 422, r.text
    answer = r.json()
    assert set(answer) == {"id", "message"} and message in answer["message"]
    assert answer["id"] == r.headers["x-request-id"]


def test_the_sdk_raises_its_error_with_our_message(servers: dict[str, ServerProcess]) -> None:
    with pytest.raises(ApiError) as raised:
        client(servers["embed"]).embed(
            model="m", texts=["a"], input_type="search_query", embedding_types=["int4"]
        )
    assert raised.value.status_code == 422 and "embedding_types" in raised.value.body["message"]


# -- /v2/rerank and /v1/rerank ----------------------------------------------------------------
@pytest.fixture(scope="module")
def predicted(cross_encoder_model: Path) -> np.ndarray:
    model = CrossEncoder(str(cross_encoder_model), device="cpu")
    return np.asarray(model.predict([(QUERY, d) for d in DOCUMENTS]))


def test_cohere_rerank_equals_cross_encoder(
    servers: dict[str, ServerProcess], predicted: np.ndarray
) -> None:
    out = client(servers["rerank"]).rerank(model="m", query=QUERY, documents=DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -predicted[i])
    assert [r.index for r in out.results] == order
    assert max_diff([r.relevance_score for r in out.results], predicted[order]) < TOL
    top = client(servers["rerank"]).rerank(model="m", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in top.results] == order[:2] and top.id
    assert top.meta is not None and top.meta.billed_units is not None
    assert top.meta.billed_units.input_tokens > 0


def test_max_tokens_per_doc_cuts_each_document(
    servers: dict[str, ServerProcess], cross_encoder_model: Path
) -> None:
    out = client(servers["rerank"]).rerank(
        model="m", query=QUERY, documents=DOCUMENTS[:2], max_tokens_per_doc=3
    )
    cut = [" ".join(d.split()[:3]) for d in DOCUMENTS[:2]]  # whole words: one token each
    expected = CrossEncoder(str(cross_encoder_model), device="cpu").predict(
        [(QUERY, d) for d in cut]
    )
    assert max_diff(sorted(r.relevance_score for r in out.results), sorted(expected)) < TOL


def test_jina_rerank_equals_cross_encoder(
    servers: dict[str, ServerProcess], predicted: np.ndarray, cross_encoder_model: Path
) -> None:
    r = servers["rerank"].post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    answer = r.json()
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -predicted[i])
    assert [x["index"] for x in answer["results"]] == order
    scores = [x["relevance_score"] for x in answer["results"]]
    assert max_diff(scores, predicted[order]) < TOL
    assert [x["document"]["text"] for x in answer["results"]] == [DOCUMENTS[i] for i in order]
    assert answer["model"] == "cross-encoder" and answer["id"]
    tok = CrossEncoder(str(cross_encoder_model), device="cpu").tokenizer
    assert answer["usage"]["total_tokens"] == sum(
        len(tok(QUERY, d)["input_ids"]) for d in DOCUMENTS
    )
    bare = (
        servers["rerank"]
        .post(
            "/v1/rerank",
            json={"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": False},
        )
        .json()
    )
    assert [x["index"] for x in bare["results"]] == order[:3]
    assert all("document" not in x for x in bare["results"])
    every = (
        servers["rerank"]
        .post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 0})
        .json()
    )
    assert len(every["results"]) == len(DOCUMENTS)  # 0: all, as vLLM reads it


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v2/rerank", {"query": "q", "documents": []}, "documents is an empty list"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v2/rerank", {"query": " ", "documents": ["a"]}, "query is empty"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents is an empty list"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a", ""]}, "documents[1] is empty"),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "max_tokens_per_doc": 2**64},
            "max_tokens_per_doc",
        ),
    ],
)
def test_bad_rerank_requests_are_4xx_in_each_shape(
    servers: dict[str, ServerProcess], path: str, body: dict[str, Any], message: str
) -> None:
    r = servers["rerank"].post(path, json=body)
    assert r.status_code == 422, r.text
    if path.startswith("/v2/"):
        assert message in r.json()["message"]
    else:
        error = r.json()["error"]
        assert message in error["message"] and error["code"] == 422


def test_routes_of_the_other_task_answer_424(servers: dict[str, ServerProcess]) -> None:
    embed, rerank = servers["embed"], servers["rerank"]
    for server, path, body in (
        (embed, "/v2/rerank", {"query": "q", "documents": ["a"]}),
        (embed, "/v1/rerank", {"query": "q", "documents": ["a"]}),
        (rerank, "/v2/embed", {"texts": ["a"]}),
    ):
        r = server.post(path, json=body)
        assert r.status_code == 424 and "not served by this deployment" in r.text, r.text
    assert "/v2/embed" in httpx.get(f"{embed.url}/openapi.json").json()["paths"]
    # counted under their own route label, as every route is
    assert embed.post("/v2/embed", json={"texts": ["a"]}).status_code == 200
    assert rerank.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200
    assert 'route="/v2/embed",status="200"' in embed.get("/metrics").text
    assert 'route="/v1/rerank",status="200"' in rerank.get("/metrics").text
