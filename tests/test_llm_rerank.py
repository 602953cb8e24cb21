"""Causal-LM rerankers: tiny `*ForCausalLM` folders saved by sentence-transformers'
`CrossEncoder` (LogitScore yes/no, Sigmoid, left padding; with and without a chat template; a
default prompt; "yes" alone), served through `MODEL_ID`, scoring what `CrossEncoder.predict`
scores and ordering as `CrossEncoder.rank` orders, on every rerank route (TEI's, Cohere's v2
with the `cohere` SDK, the Jina/vLLM shape); batches within the
token budget; folders refused at start; the real server and schemathesis on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ServerProcess, app_client, schemathesis_finds_nothing
from prometheus_client import REGISTRY
from retrieval_models import CHAT_TEMPLATE, LLM_RERANKER_KINDS, llm_reranker
from starlette.testclient import TestClient

from service.engine.folders import UnsupportedModel
from service.engine.loading.load import infer_task, preflight
from service.settings import Settings

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "paris is the capital of france.",
    "berlin is a city in germany",
    "hello world",
    "the river in the city is big and the city is small, and more text about it",
    "rome",
]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm-rerank")
    return {kind: llm_reranker(root / kind, **kw) for kind, kw in LLM_RERANKER_KINDS.items()}


def cross_encoder(folder: Path) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu")


@pytest.fixture(scope="module", params=sorted(LLM_RERANKER_KINDS))
def served(
    request: pytest.FixtureRequest, folders: dict[str, Path]
) -> Iterator[tuple[Any, TestClient]]:
    folder = folders[request.param]
    with app_client(folder, max_batch_wait_ms=20) as client:
        yield cross_encoder(folder), client


def test_inferred_as_a_reranker(folders: dict[str, Path]) -> None:
    for folder in folders.values():
        assert infer_task(str(folder), Settings(model_id=str(folder))) == "text-classification"


def test_rerank_scores_are_predict_and_the_order_is_rank(served: tuple[Any, TestClient]) -> None:
    model, client = served
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert r.status_code == 200, r.text
    expected = model.predict([[QUERY, d] for d in DOCUMENTS])
    by_index = {x["index"]: x["score"] for x in r.json()}
    assert [by_index[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=TOLERANCE)
    ranked = model.rank(QUERY, DOCUMENTS)
    assert [x["index"] for x in r.json()] == [x["corpus_id"] for x in ranked]
    assert [x["text"] for x in r.json()] == [DOCUMENTS[x["corpus_id"]] for x in ranked]
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    logits = {x["index"]: x["score"] for x in raw.json()}
    sigmoid = {i: 1 / (1 + np.exp(-v)) for i, v in logits.items()}
    assert [sigmoid[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=TOLERANCE)


def test_cohere_and_jina_rerank_score_as_predict(served: tuple[Any, TestClient]) -> None:
    """Every rerank route: Cohere's v2 and the Jina/vLLM shape apply the folder's own
    activation (Sigmoid), as `CrossEncoder.predict`; Cohere's `max_tokens_per_doc` cuts each
    document to its first tokens first."""
    model, client = served
    expected = model.predict([[QUERY, d] for d in DOCUMENTS])
    order = [x["corpus_id"] for x in model.rank(QUERY, DOCUMENTS)]
    assert client.get("/info").json()["model"]["score_activation"] == "sigmoid"
    jina = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert [x["index"] for x in jina["results"]] == order
    got = [x["relevance_score"] for x in jina["results"]]
    assert got == pytest.approx([float(expected[i]) for i in order], abs=TOLERANCE)
    body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    cohere = client.post("/v2/rerank", json=body).json()
    assert [x["index"] for x in cohere["results"]] == order[:2]
    cut = client.post("/v2/rerank", json={**body, "top_n": None, "max_tokens_per_doc": 3}).json()
    three = model.predict([[QUERY, " ".join(d.split()[:3])] for d in DOCUMENTS])  # a word a token
    by_index = {x["index"]: x["relevance_score"] for x in cut["results"]}
    assert [by_index[i] for i in range(len(DOCUMENTS))] == pytest.approx(three, abs=TOLERANCE)


def test_pairs_alone_and_in_shared_batches(served: tuple[Any, TestClient]) -> None:
    """One pair per request, all at once: left-padded together, each scores as alone."""
    model, client = served
    bodies = [{"query": QUERY, "texts": [d]} for d in DOCUMENTS]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: client.post("/rerank", json=b), bodies))
    expected = model.predict([[QUERY, d] for d in DOCUMENTS])
    assert [a.json()[0]["score"] for a in answers] == pytest.approx(expected, abs=TOLERANCE)


def test_predict_and_the_inference_api(served: tuple[Any, TestClient]) -> None:
    model, client = served
    pairs = [[QUERY, d] for d in DOCUMENTS[:2]]
    expected = model.predict(pairs)
    predicted = client.post("/predict", json={"inputs": pairs})
    assert predicted.status_code == 200, predicted.text
    assert [p[0]["score"] for p in predicted.json()] == pytest.approx(expected, abs=TOLERANCE)
    assert {p[0]["label"] for p in predicted.json()} == {"yes"}
    root = client.post("/", json={"inputs": [{"text": q, "text_pair": d} for q, d in pairs]})
    assert root.status_code == 200, root.text
    assert [x[0]["score"] for x in root.json()] == pytest.approx(expected, abs=TOLERANCE)
    single = client.post("/predict", json={"inputs": "hello world"})  # one text, as predict
    assert single.json()[0]["score"] == pytest.approx(
        float(model.predict("hello world")), abs=TOLERANCE
    )


def test_long_pairs_are_refused_or_cut_as_predict_cuts_them(served: tuple[Any, TestClient]) -> None:
    model, client = served
    long = "the city is big and the river is small " * 25  # over the 160-token limit
    refused = client.post("/rerank", json={"query": QUERY, "texts": [DOCUMENTS[0], long]})
    assert refused.status_code == 422 and "takes at most 160 tokens" in refused.json()["error"]
    cut = client.post("/rerank", json={"query": QUERY, "texts": [long], "truncate": True})
    expected = model.predict([[QUERY, long]])  # sentence-transformers always cuts
    assert cut.json()[0]["score"] == pytest.approx(float(expected[0]), abs=TOLERANCE)


def test_info_names_the_modules(served: tuple[Any, TestClient]) -> None:
    model, client = served
    info = client.get("/info").json()["model"]
    assert info["task"] == "text-classification" and info["labels"] == ["yes"]
    assert info["max_input_tokens"] == model.max_seq_length == 160
    assert info["modules"][0].startswith("Transformer(text-generation")
    assert info["modules"][1] in ("LogitScore(yes - no)", "LogitScore(yes)")


def test_batches_stay_within_the_token_budget(folders: dict[str, Path]) -> None:
    """MAX_BATCH_TOKENS bounds the padded tokens of every batch of more than one pair."""

    def buckets() -> tuple[float, float]:
        get = REGISTRY.get_sample_value
        return (
            get("pipeline_server_batch_padded_tokens_count") or 0.0,
            get("pipeline_server_batch_padded_tokens_bucket", {"le": "64.0"}) or 0.0,
        )

    with app_client(folders["pairs"], max_batch_tokens=64, max_batch_wait_ms=50) as client:
        before = buckets()
        bodies = [{"query": QUERY, "texts": [d]} for d in DOCUMENTS * 3]
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: client.post("/rerank", json=b), bodies))
        assert all(a.status_code == 200 for a in answers)
        after = buckets()
    batches, within = after[0] - before[0], after[1] - before[1]
    assert batches >= 2 and within == batches  # every pair is under 64 tokens alone


# -- folders refused at start ----------------------------------------------------------------
def _edit(folder: Path, name: str, change: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return folder


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("modules.json", lambda m: [*m, {**m[1], "type": "x.Extra", "path": "2_Extra"}]),
            "modules.json lists Transformer -> LogitScore -> Extra: only Transformer "
            "(text-generation) -> LogitScore",
        ),
        (
            (
                "sentence_bert_config.json",
                lambda c: {**c, "processing_kwargs": {"chat_template": {"x": 1}}},
            ),
            "Transformer module's processing_kwargs {'chat_template': {'x': 1}} are not supported",
        ),
        (
            (
                "sentence_bert_config.json",
                lambda c: {
                    **c,
                    "modality_config": {**c["modality_config"], "message": {"format": "auto"}},
                },
            ),
            "Transformer module (task text-generation, modalities ['message', 'text'], keys "
            "known) is not supported for a causal-LM reranker",
        ),
    ],
    ids=["extra-module", "processing-kwargs", "auto-format"],
)
def test_folders_with_options_not_served_are_refused_at_start(
    tmp_path: Path, change: tuple[str, Any], message: str
) -> None:
    folder = _edit(llm_reranker(tmp_path / "m", chat_template=CHAT_TEMPLATE), *change)
    with pytest.raises(UnsupportedModel) as info:
        preflight(Settings(model_id=str(folder)))
    assert str(info.value).startswith(message)


# -- the real server ----------------------------------------------------------------------------
FUZZ_ENV = {"MAX_CLIENT_BATCH_SIZE": "8", "LONG_INPUTS": "truncate", "TORCH_NUM_THREADS": "1"}


@pytest.mark.server
def test_real_server_serves_an_llm_reranker(
    start_server: Any, folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = folders["chat"]
    server: ServerProcess = start_server(MODEL_ID=str(folder), **FUZZ_ENV)
    server.wait_ready()
    model = cross_encoder(folder)
    long = "the city is big and the river is small " * 25
    texts = [*DOCUMENTS, long]
    ranked = server.post("/rerank", json={"query": QUERY, "texts": texts}).json()
    expected = model.predict([[QUERY, d] for d in texts])
    assert [x["index"] for x in ranked] == [x["corpus_id"] for x in model.rank(QUERY, texts)]
    by_index = {x["index"]: x["score"] for x in ranked}
    assert [by_index[i] for i in range(len(texts))] == pytest.approx(expected, abs=TOLERANCE)
    import cohere

    sdk = cohere.ClientV2(api_key="unused", base_url=server.url, max_retries=0, timeout=60)
    out = sdk.rerank(model="m", query=QUERY, documents=texts)
    assert [r.index for r in out.results] == [x["index"] for x in ranked]
    assert [r.relevance_score for r in out.results] == pytest.approx(
        [float(expected[x["index"]]) for x in ranked], abs=TOLERANCE
    )
    doc = server.get("/openapi.json").json()
    assert {"/", "/rerank", "/v1/rerank", "/v2/rerank", "/predict"} <= set(doc["paths"])
    schemathesis_finds_nothing(server.url, tmp_path)
