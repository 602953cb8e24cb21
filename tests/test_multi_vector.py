"""Multi-vector (ColBERT-style) models: tiny folders saved by sentence-transformers'
`MultiVectorEncoder`, served through `MODEL_ID`, answering what `encode_query`,
`encode_document` and `similarity` answer; the folders refused at start; the routes that do
not apply; the real server, its OpenAPI document and schemathesis on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ServerProcess, app_client, schemathesis_finds_nothing
from retrieval_models import MULTI_VECTOR_KINDS, multi_vector_model
from starlette.testclient import TestClient

from service.engine.folders import UnsupportedModel
from service.engine.loading.load import preflight
from service.engine.multi_vector.config import is_multi_vector
from service.settings import Settings

QUERIES = [
    "paris",
    "is the capital of france?",
    "what river, in which city?",
    "john lives in london and works at acme on monday with some words and more text",
]
DOCUMENTS = [
    "paris is the capital of france.",
    "berlin is a city, in germany; rome is in italy!",
    "hello world",
    "the river in the city is big, the city is small. " * 3,
    "a sentence with some words and more text about the model test",
]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multi-vector")
    return {kind: multi_vector_model(root / kind, **kw) for kind, kw in MULTI_VECTOR_KINDS.items()}


def encoder(folder: Path) -> Any:
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(folder), device="cpu")


def assert_vectors(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g, e = np.asarray(g, dtype=np.float32), np.asarray(e, dtype=np.float32)
        assert g.shape == e.shape
        assert np.abs(g - e).max() <= TOLERANCE


@pytest.fixture(scope="module", params=sorted(MULTI_VECTOR_KINDS))
def served(
    request: pytest.FixtureRequest, folders: dict[str, Path]
) -> Iterator[tuple[Any, TestClient]]:
    folder = folders[request.param]
    with app_client(folder, max_batch_wait_ms=20) as client:
        yield encoder(folder), client


def test_embed_multi_answers_encode_query_and_encode_document(
    served: tuple[Any, TestClient],
) -> None:
    model, client = served
    for input_type, encode, texts in (
        ("query", model.encode_query, QUERIES),
        ("document", model.encode_document, DOCUMENTS),
    ):
        r = client.post(
            "/embed_multi", json={"inputs": texts, "input_type": input_type, "truncate": True}
        )
        assert r.status_code == 200, r.text
        assert_vectors(r.json(), encode(texts, convert_to_numpy=True))
    one = client.post("/embed_multi", json={"inputs": "paris", "input_type": "query"})
    assert_vectors(one.json(), [model.encode_query("paris", convert_to_numpy=True)])


def test_each_input_alone_and_in_shared_batches(served: tuple[Any, TestClient]) -> None:
    """Queries and documents sent one per request at once share batches (padded together)
    and still answer what they answer alone."""
    model, client = served
    bodies = [{"inputs": [q], "input_type": "query", "truncate": True} for q in QUERIES] + [
        {"inputs": [d], "input_type": "document", "truncate": True} for d in DOCUMENTS
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: client.post("/embed_multi", json=b), bodies))
    expected = [*model.encode_query(QUERIES, convert_to_numpy=True)]
    expected += [*model.encode_document(DOCUMENTS, convert_to_numpy=True)]
    assert_vectors([a.json()[0] for a in answers], expected)


def test_rerank_is_the_encoders_similarity_in_its_order(served: tuple[Any, TestClient]) -> None:
    model, client = served
    for query in QUERIES:
        r = client.post(
            "/rerank",
            json={"query": query, "texts": DOCUMENTS, "truncate": True, "raw_scores": True},
        )
        assert r.status_code == 200, r.text
        q = model.encode_query([query], convert_to_numpy=True)
        d = model.encode_document(DOCUMENTS, convert_to_numpy=True)
        expected = model.similarity(q, d)[0].tolist()
        by_index = {x["index"]: x["score"] for x in r.json()}
        assert [by_index[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=1e-3)
        order = sorted(range(len(expected)), key=lambda i: (-expected[i], i))
        assert [x["index"] for x in r.json()] == order
        plain = client.post("/rerank", json={"query": query, "texts": DOCUMENTS, "truncate": True})
        assert plain.json() == r.json()  # no activation: raw_scores changes nothing


def test_cohere_and_jina_rerank_are_the_encoders_similarity(
    served: tuple[Any, TestClient],
) -> None:
    """`/v2/rerank` and `/v1/rerank` answer what `/rerank` does on these models (each document's
    late-interaction score, highest first), in each dialect's shape, with its fields."""
    model, client = served
    for query in QUERIES:
        q = model.encode_query([query], convert_to_numpy=True)
        documents = model.encode_document(DOCUMENTS, convert_to_numpy=True)
        expected = model.similarity(q, documents)[0].tolist()
        order = sorted(range(len(expected)), key=lambda i: (-expected[i], i))
        body = {"query": query, "documents": DOCUMENTS}
        cohere = client.post("/v2/rerank", json={**body, "top_n": 2})
        jina = client.post("/v1/rerank", json={**body, "return_documents": False})
        assert cohere.status_code == jina.status_code == 200, (cohere.text, jina.text)
        results = cohere.json()["results"]
        assert [x["index"] for x in results] == order[:2]
        assert [x["relevance_score"] for x in results] == pytest.approx(
            [expected[i] for i in order[:2]], abs=1e-4
        )
        answer = jina.json()
        assert [x["index"] for x in answer["results"]] == order
        assert all("document" not in x for x in answer["results"])
        tokens = len(_ids(model, query, "query")) + sum(
            len(_ids(model, d, "document")) for d in DOCUMENTS
        )
        assert answer["usage"]["total_tokens"] == tokens
        assert cohere.json()["meta"]["billed_units"]["input_tokens"] == tokens


def _ids(model: Any, text: str, task: str) -> list[int]:
    """The ids `MultiVectorEncoder` encodes `text` alone as (a query's expansion included)."""
    features = model.preprocess([text], prompt=model.prompts.get(task) or None, task=task)
    return [int(i) for i in features["input_ids"][0]]


def test_max_tokens_per_doc_cuts_each_document_first(folders: dict[str, Path]) -> None:
    model = encoder(folders["colbert"])
    cut = [" ".join(d.split()[:3]) for d in DOCUMENTS]  # whole words: one token each
    expected = model.similarity(model.encode_query(["paris city"]), model.encode_document(cut))[
        0
    ].tolist()
    with app_client(folders["colbert"]) as client:
        body = {"query": "paris city", "documents": DOCUMENTS, "max_tokens_per_doc": 3}
        r = client.post("/v2/rerank", json=body)
        assert r.status_code == 200, r.text
        by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert [by_index[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=1e-4)
        r = client.post("/v2/rerank", json={**body, "max_tokens_per_doc": 0})
        assert r.status_code == 422 and "max_tokens_per_doc" in r.json()["message"]
        r = client.post("/v1/rerank", json={"query": "a", "documents": ["b"], "top_n": -1})
        assert r.status_code == 422 and "top_n" in r.json()["error"]["message"]


def test_info_says_multi_vector(served: tuple[Any, TestClient]) -> None:
    model, client = served
    info = client.get("/info").json()["model"]
    mv = info["multi_vector"]
    assert mv["dimension"] == model.get_embedding_dimension() == info["dimension"] == 8
    assert mv["scoring"] == model.similarity_fn_name
    transformer = model[0]
    expansion = transformer.query_expansion
    if expansion and expansion["strategy"] == "fixed":
        assert mv["query_length"] == expansion["length"]
    assert mv["document_length"] == (transformer.document_length or info["max_input_tokens"])
    assert info["modules"][0] == "Transformer" and info["modules"][1] == "Dense(32->8, Identity)"


def test_pooled_routes_name_embed_multi(served: tuple[Any, TestClient]) -> None:
    _, client = served
    for path, body in (
        ("/embed", {"inputs": "hello"}),
        ("/v1/embeddings", {"input": "hello"}),
        ("/", {"inputs": "hello"}),
        ("/embed_all", {"inputs": "hello"}),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        ("/predict", {"inputs": "hello"}),
    ):
        r = client.post(path, json=body)
        assert r.status_code == 424, (path, r.text)
        assert "use /embed_multi" in str(r.json()["error"]), path


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"inputs": "a", "input_type": "passage"}, 422, "input_type: Input should be 'query' or"),
        ({"inputs": "a"}, 422, "input_type is missing"),
        ({"inputs": "", "input_type": "query"}, 422, "inputs is empty"),
        ({"inputs": [], "input_type": "query"}, 422, "inputs is an empty list"),
        ({"inputs": [1, 2], "input_type": "query"}, 422, "inputs[0] must be a string"),
        ({"inputs": "a", "input_type": "query", "top_k": 1}, 422, "unknown field(s) top_k"),
    ],
)
def test_bad_requests_are_clear_4xx(
    served: tuple[Any, TestClient], body: dict[str, Any], status: int, message: str
) -> None:
    _, client = served
    r = client.post("/embed_multi", json=body)
    assert r.status_code == status and message in r.json()["error"], r.text


def test_an_input_over_its_length_is_refused_unless_truncated(
    folders: dict[str, Path],
) -> None:
    with app_client(folders["colbert"]) as client:
        long = " ".join(["paris"] * 30)
        r = client.post("/embed_multi", json={"inputs": ["paris", long], "input_type": "query"})
        assert r.status_code == 422
        assert r.json()["error"].startswith("inputs[1]: input is 33 tokens")
        assert "takes at most 16 tokens as a query" in r.json()["error"]
        r = client.post("/rerank", json={"query": "paris", "texts": [long * 2]})
        assert r.status_code == 422 and r.json()["error"].startswith("texts[0]: input is ")
        ok = client.post(
            "/embed_multi", json={"inputs": long, "input_type": "query", "truncate": True}
        )
        assert np.asarray(ok.json()[0]).shape == (16, 8)


def test_embed_multi_on_a_pooled_model_is_424(embedded_client: TestClient) -> None:
    r = embedded_client.post("/embed_multi", json={"inputs": "a", "input_type": "query"})
    assert r.status_code == 424
    assert r.json()["error"] == (
        "/embed_multi is not served by this deployment: it serves feature-extraction "
        "(an embedding model)"
    )


# -- folders refused at start, each naming what it carries ------------------------------------
def _edit(folder: Path, name: str, change: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return folder


def _stanford(folder: Path) -> Path:
    """A Stanford-NLP ColBERT checkpoint: a BERT whose config names HF_ColBERT, no modules."""
    from retrieval_models import bert_backbone

    return _edit(
        bert_backbone(folder), "config.json", lambda c: {**c, "architectures": ["HF_ColBERT"]}
    )


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda f: _edit(
                multi_vector_model(f, mask={}),
                "modules.json",
                lambda m: [*m, {**m[-1], "idx": 4, "name": "4", "type": "pylate.models.Other"}],
            ),
            "module pylate.models.Other (in 3_Normalize) is not supported by this server in a "
            "multi-vector model: it serves Transformer -> Dense (any number) -> optional "
            "MultiVectorMask -> optional Normalize, with one optional HierarchicalTokenPooling "
            "after the Dense modules and the mask; sentence-transformers' MultiVectorEncoder "
            "loads the folder with that module in Python",
        ),
        (
            lambda f: _edit(
                multi_vector_model(f, mask={}),
                "sentence_bert_config.json",
                lambda c: {**c, "processing_kwargs": {"text": {"padding": "max_length"}}},
            ),
            "Transformer module's processing_kwargs {'text': {'padding': 'max_length'}} are not "
            "supported",
        ),
        (
            lambda f: _edit(
                multi_vector_model(f, mask={}),
                "config_sentence_transformers.json",
                lambda c: {**c, "model_type": "SentenceTransformer"},
            ),
            "",  # not a multi-vector folder: read as a sentence-transformers one
        ),
        (
            _stanford,
            "a Stanford-NLP ColBERT checkpoint (HF_ColBERT) is not served as is: "
            "sentence-transformers' MultiVectorEncoder loads it: MultiVectorEncoder(folder)"
            ".save(new) writes the modules its encode applies",
        ),
        (
            lambda f: _edit(
                multi_vector_model(f, mask={}),
                "modules.json",
                lambda m: [m[0], m[3], m[1], m[2]],
            ),
            "modules.json lists Transformer -> Normalize -> Dense -> MultiVectorMask: only "
            "Transformer -> Dense (any number) -> optional MultiVectorMask -> optional Normalize",
        ),
        (
            lambda f: _edit(
                multi_vector_model(f, mask={}, token_pooling={"pool_factor": 2}),
                "modules.json",
                lambda m: [m[0], m[1], m[4], m[2], m[3]],
            ),
            "modules.json lists Transformer -> Dense -> HierarchicalTokenPooling -> "
            "MultiVectorMask -> Normalize: only",
        ),
    ],
    ids=[
        "other-module",
        "processing-kwargs",
        "not-multi-vector",
        "stanford",
        "order",
        "pool-order",
    ],
)
def test_folders_with_options_not_served_are_refused_at_start(
    tmp_path: Path, build: Any, message: str
) -> None:
    folder = build(tmp_path / "m")
    if not message:
        assert not is_multi_vector(folder)
        return
    with pytest.raises(UnsupportedModel) as info:
        preflight(Settings(model_id=str(folder)))
    assert str(info.value).startswith(message)


# -- the real server ----------------------------------------------------------------------------
FUZZ_ENV = {"MAX_CLIENT_BATCH_SIZE": "8", "LONG_INPUTS": "truncate", "TORCH_NUM_THREADS": "1"}


@pytest.mark.server
def test_real_server_serves_a_multi_vector_folder(
    start_server: Any, folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = folders["colbert"]
    server: ServerProcess = start_server(MODEL_ID=str(folder), **FUZZ_ENV)
    server.wait_ready()
    model = encoder(folder)
    r = server.post("/embed_multi", json={"inputs": DOCUMENTS, "input_type": "document"})
    assert_vectors(r.json(), model.encode_document(DOCUMENTS, convert_to_numpy=True))
    ranked = server.post("/rerank", json={"query": QUERIES[1], "texts": DOCUMENTS}).json()
    q = model.encode_query([QUERIES[1]], convert_to_numpy=True)
    expected = model.similarity(q, model.encode_document(DOCUMENTS, convert_to_numpy=True))[0]
    assert [x["index"] for x in ranked] == np.argsort(-expected.numpy(), kind="stable").tolist()
    doc = server.get("/openapi.json").json()
    assert "/embed_multi" in doc["paths"] and "/" not in doc["paths"]
    assert set(doc["paths"]) >= {"/rerank", "/v2/rerank", "/v1/rerank", "/tokenize", "/decode"}
    assert "/embed" not in doc["paths"] and "/v1/embeddings" not in doc["paths"]
    schemathesis_finds_nothing(server.url, tmp_path)
