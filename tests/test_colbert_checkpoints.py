"""PyLate checkpoints as published (saved by PyLate 1.6's own `models.ColBERT.save`, in its own
venv: `tests/reference_venv.py`, `tests/pylate_reference.py`), served as sentence-transformers
6.3's `MultiVectorEncoder` loads them: `/embed_multi` equal to `MultiVectorEncoder.encode_query`
/ `encode_document` here and to PyLate's own `encode` there; MaxSim on `/rerank`, Cohere's
`/v2/rerank` (the `cohere` SDK) and Jina's `/v1/rerank` equal to PyLate's `colbert_scores` and
to `MultiVectorEncoder.similarity`; `pool_factor` equal to PyLate's own pooling (its means,
normalized). The tests skip, saying why, only where PyLate's venv cannot be built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import numpy as np
import pytest
from helpers import ServerProcess, app_client
from reference_venv import PYLATE, ReferenceUnavailable, reference_python, run_reference
from retrieval_models import bert_backbone
from sentence_transformers import MultiVectorEncoder

from service.engine.multi_vector.config import read_multi_vector_config

SCRIPT = Path(__file__).with_name("pylate_reference.py")
QUERIES = ["paris", "what river, in which city?", "capital of france"]
DOCUMENTS = [
    "paris is the capital of france.",
    "berlin is a city, in germany; rome is in italy!",
    "the river in the city is big, the city is small. " * 3,
    "hello world",
]
#: PyLate's save options per folder: ColBERT's defaults at a tiny size; and one with the
#: expansion attended to, a prefix from the vocabulary and its own skiplist.
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "pylate": {"query_length": 16, "document_length": 40, "embedding_size": 8},
    "pylate-attend": {
        "query_length": 12,
        "document_length": 24,
        "embedding_size": 8,
        "attend_to_expansion_tokens": True,
        "query_prefix": "[unused0]",
        "skiplist_words": [",", "!"],
    },
}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def pylate() -> Path:
    try:
        return reference_python(PYLATE)
    except ReferenceUnavailable as exc:
        pytest.skip(f"PyLate's venv cannot be built here: {exc}")


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(
    request: pytest.FixtureRequest, pylate: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """A PyLate checkpoint and PyLate's own answers on it."""
    root = tmp_path_factory.mktemp(request.param)
    backbone = bert_backbone(root / "backbone", markers=False)
    folder = root / "colbert"
    save = {"backbone": str(backbone), "folder": str(folder), "options": CHECKPOINTS[request.param]}
    run_reference(pylate, SCRIPT, {"save": save})
    encode = {"folder": str(folder), "queries": QUERIES, "documents": DOCUMENTS, "pool_factor": 2}
    return folder, run_reference(pylate, SCRIPT, {"encode": encode})


def assert_rows(got: Any, expected: Any, tolerance: float = TOLERANCE) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g, e = np.asarray(g, dtype=np.float32), np.asarray(e, dtype=np.float32)
        assert g.shape == e.shape
        assert np.abs(g - e).max() <= tolerance


def test_the_folder_is_pylates_layout(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    """What PyLate wrote, and what the server reads of it: the prefixes as prompts and special
    tokens, PyLate's expansion, its inline mask and normalization."""
    folder, _ = checkpoint
    modules = (folder / "modules.json").read_text()
    assert "pylate.models.Dense.Dense" in modules and "MultiVectorMask" not in modules
    config = read_multi_vector_config(folder)
    st = MultiVectorEncoder(str(folder), device="cpu")
    assert config.prompts == st.prompts
    assert config.prefix_tokens == tuple(st.prompts.values())
    assert config.expansion is not None and config.mask is not None and config.normalize
    expansion = st[0].query_expansion
    assert (config.expansion.length, config.expansion.attend) == (
        expansion["length"],
        expansion["attend"],
    )
    assert config.mask.skiplist_words == tuple(st[2].skiplist_words)
    assert config.document_length == st[0].document_length


def test_served_as_multi_vector_encoder_loads_it(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    folder, reference = checkpoint
    st = MultiVectorEncoder(str(folder), device="cpu")
    with app_client(folder) as client:
        queries = client.post(
            "/embed_multi", json={"inputs": QUERIES, "input_type": "query", "truncate": True}
        )
        documents = client.post(
            "/embed_multi", json={"inputs": DOCUMENTS, "input_type": "document", "truncate": True}
        )
        assert queries.status_code == documents.status_code == 200, queries.text
        assert_rows(queries.json(), st.encode_query(QUERIES, convert_to_numpy=True))
        assert_rows(documents.json(), st.encode_document(DOCUMENTS, convert_to_numpy=True))
        assert_rows(queries.json(), reference["queries"])
        assert_rows(documents.json(), reference["documents"])
        info = client.get("/info").json()["model"]
        assert info["modules"] == [
            "Transformer",
            "Dense(32->8, Identity)",
            "MultiVectorMask",
            "Normalize",
        ]


@pytest.fixture(scope="module")
def server(
    checkpoint: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder, _ = checkpoint
    process = ServerProcess(
        {"MODEL_ID": str(folder), "LONG_INPUTS": "truncate"},
        tmp_path_factory.mktemp("logs") / "server.log",
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.terminate()


@pytest.mark.server
def test_real_server_answers_pylates_encode_and_scores(
    server: ServerProcess, checkpoint: tuple[Path, dict[str, Any]]
) -> None:
    folder, reference = checkpoint
    st = MultiVectorEncoder(str(folder), device="cpu")
    documents = server.post(
        "/embed_multi", json={"inputs": DOCUMENTS, "input_type": "document", "truncate": True}
    )
    assert_rows(documents.json(), reference["documents"])
    assert_rows(documents.json(), st.encode_document(DOCUMENTS, convert_to_numpy=True))
    sdk = cohere.ClientV2(api_key="unused", base_url=server.url, max_retries=0, timeout=60)
    for q, query in enumerate(QUERIES):
        expected = np.asarray(reference["scores"][q], dtype=np.float32)
        similarity = st.similarity(st.encode_query([query]), st.encode_document(DOCUMENTS))[0]
        assert np.abs(expected - similarity.numpy()).max() <= 1e-4
        order = sorted(range(len(DOCUMENTS)), key=lambda i: (-expected[i], i))
        tei = server.post(
            "/rerank", json={"query": query, "texts": DOCUMENTS, "truncate": True}
        ).json()
        jina = server.post("/v1/rerank", json={"query": query, "documents": DOCUMENTS}).json()
        answer = sdk.rerank(model="m", query=query, documents=DOCUMENTS)
        for ranked in (
            [(x["index"], x["score"]) for x in tei],
            [(x["index"], x["relevance_score"]) for x in jina["results"]],
            [(x.index, x.relevance_score) for x in answer.results],
        ):
            assert [i for i, _ in ranked] == order
            assert np.abs(np.asarray([s for _, s in ranked]) - expected[order]).max() <= 1e-4
        assert [x["document"]["text"] for x in jina["results"]] == [DOCUMENTS[i] for i in order]


@pytest.mark.server
def test_real_server_pools_as_pylate(
    server: ServerProcess, checkpoint: tuple[Path, dict[str, Any]]
) -> None:
    """PyLate's `encode(pool_factor=2)` keeps its cluster means unnormalized; sentence-
    transformers (and the server) normalize them: the same clusters, in the same order."""
    _, reference = checkpoint
    body = {"inputs": DOCUMENTS, "input_type": "document", "pool_factor": 2}
    got = server.post("/embed_multi", json=body).json()
    means = [np.asarray(d, dtype=np.float32) for d in reference["pooled"]]
    assert_rows(got, [m / np.linalg.norm(m, axis=1, keepdims=True) for m in means], 1e-4)
    assert sum(map(len, got)) < sum(map(len, reference["documents"]))
