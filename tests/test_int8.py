"""int8/uint8 embeddings and the width a model emits (in-process).

The ranges are each dimension's min and max over the calibration set as
`SentenceTransformer.encode` embeds it; the codes are `quantize_embeddings` with those ranges,
the same for a text alone or among others, on every route that takes an encoding. A model
that projects inside its forward is served at the width it emits, and a wider `dimensions` is
a 422, not a 500.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_models import PROJECTED, sentence_model, splade_model
from helpers import app_client
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from starlette.testclient import TestClient
from transformers import AutoConfig

from service.engine.jobs import Ranged
from service.engine.loading.load import load_engine
from service.engine.pooling.calibration import read_set
from service.protocols.encodings import encode_vector, scalar_buckets
from service.settings import Settings

TEXTS = ["paris is the capital of france", "a big city", "john lives in london", "hello world"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense model without a Normalize module (so normalization is a choice)."""
    root = tmp_path_factory.mktemp("int8")
    return sentence_model(root / "raw", "bert", ("mean",), ((16, "Tanh"),), normalize=False)


@pytest.fixture(scope="module")
def st(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def client(folder: Path) -> Iterator[TestClient]:
    with app_client(folder) as c:
        yield c


@pytest.fixture(scope="module")
def calibration(st: SentenceTransformer) -> np.ndarray:
    """The packaged calibration texts as `encode` embeds them (no normalization: this model
    has none)."""
    return np.asarray(st.encode(list(read_set().texts)))


def ranges_of(vectors: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    x = vectors if dimensions is None else vectors[:, :dimensions]
    if normalize:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return np.stack([x.min(axis=0), x.max(axis=0)])


def codes(client: TestClient, path: str, body: dict[str, Any]) -> np.ndarray:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    if path == "/v1/embeddings":
        out = [d["embedding"] for d in out["data"]]
    return np.asarray(out)


def assert_codes(got: np.ndarray, expected: np.ndarray) -> None:
    """The server's codes and `quantize_embeddings`' on sentence-transformers' floats: equal,
    but for a float32 rounding that puts a value on the other side of a bucket edge (at most
    one step, and rare)."""
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02, diff


def test_info_states_the_calibration_set(client: TestClient) -> None:
    packaged = read_set()
    assert len(packaged.texts) >= 300 and packaged.source == "packaged"
    digest = hashlib.sha256("\n".join(packaged.texts).encode()).hexdigest()
    calibration = client.get("/info").json()["model"]["calibration"]
    assert calibration["texts"] == len(packaged.texts) and calibration["sha256"] == digest
    assert calibration["source"] == "packaged" and calibration["seconds"] >= 0


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings", "/"])
def test_int8_and_uint8_equal_quantize_embeddings(
    client: TestClient, st: SentenceTransformer, calibration: np.ndarray, path: str
) -> None:
    """TEI and POST / answer the model's own vectors (not normalized here), OpenAI normalized
    ones: each quantized with the ranges of vectors like it."""
    normalize = path == "/v1/embeddings"
    floats = np.asarray(st.encode(TEXTS, normalize_embeddings=normalize))
    ranges = ranges_of(calibration, normalize)
    key = "input" if path == "/v1/embeddings" else "inputs"
    for precision in ("int8", "uint8"):
        got = codes(client, path, {key: TEXTS, "encoding_format": precision})
        expected = quantize_embeddings(floats, precision, ranges=ranges)
        assert got.shape == expected.shape == (4, 16)
        assert_codes(got, expected)
    signed = codes(client, path, {key: TEXTS, "encoding_format": "int8"})
    unsigned = codes(client, path, {key: TEXTS, "encoding_format": "uint8"})
    assert (unsigned == signed + 128).all()


def test_cut_vectors_are_normalized_then_quantized_on_their_own_ranges(
    client: TestClient, st: SentenceTransformer, calibration: np.ndarray
) -> None:
    floats = np.asarray(st.encode(TEXTS, truncate_dim=6, normalize_embeddings=True))
    got = codes(
        client,
        "/embed",
        {"inputs": TEXTS, "dimensions": 6, "encoding_format": "int8", "normalize": True},
    )
    assert_codes(got, quantize_embeddings(floats, "int8", ranges=ranges_of(calibration, True, 6)))


def test_codes_never_depend_on_the_call(client: TestClient) -> None:
    """sentence-transformers' default (ranges from the call's own texts) would move them."""
    alone = [codes(client, "/embed", {"inputs": t, "encoding_format": "int8"})[0] for t in TEXTS]
    together = codes(client, "/embed", {"inputs": TEXTS * 3, "encoding_format": "int8"})
    assert (np.asarray(alone * 3) == together).all()


def test_the_formula_is_quantize_embeddings_bit_for_bit() -> None:
    """Outside the calibrated range too: the end buckets, as quantize_embeddings clips."""
    rng = np.random.default_rng(0)
    ranges = np.sort(rng.normal(size=(2, 32)).astype(np.float32), axis=0)
    ranges[:, 3] = 0.25  # a zero-width dimension: step 1
    x = rng.normal(scale=2.0, size=(50, 32)).astype(np.float32)
    for precision in ("int8", "uint8"):
        ours = np.stack([encode_vector(Ranged(v, ranges), precision) for v in x])
        theirs = quantize_embeddings(x, precision, ranges=ranges)
        assert ours.dtype == theirs.dtype and (ours == theirs).all()
    buckets = scalar_buckets(x, ranges)
    assert buckets.min() == 0 and buckets.max() == 255


def test_calibration_file_is_read_and_stated(folder: Path, tmp_path: Path) -> None:
    texts = ["one text", "another text about paris", "# a comment line, skipped"]
    own = tmp_path / "calibration.txt"
    own.write_text("# a comment\n\n" + "\n".join(texts) + "\n", encoding="utf-8")
    with app_client(folder, calibration_file=str(own)) as c:
        calibration = c.get("/info").json()["model"]["calibration"]
        got = codes(c, "/embed", {"inputs": TEXTS, "encoding_format": "uint8"})
    assert calibration["texts"] == 2 and calibration["source"] == str(own)
    st = SentenceTransformer(str(folder), device="cpu")
    ranges = ranges_of(np.asarray(st.encode(texts[:2])), False)
    assert_codes(got, quantize_embeddings(np.asarray(st.encode(TEXTS)), "uint8", ranges=ranges))


def test_the_vectors_are_cached_with_the_model(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = load_engine(Settings(model_id=str(folder)))
    files = list((tmp_path / "pipeline-server" / "calibration").glob("*.npy"))
    assert len(files) == 1
    cached = np.load(files[0])
    assert cached.shape == (len(read_set().texts), 16)
    assert np.array_equal(cached, first.calibration.vectors)  # type: ignore[attr-defined]
    np.save(files[0], cached * 2)  # what a restart reads back
    again = load_engine(Settings(model_id=str(folder)))
    assert np.array_equal(again.calibration.vectors, cached * 2)  # type: ignore[attr-defined]
    files[0].write_bytes(b"not an array")  # unreadable: embedded again
    third = load_engine(Settings(model_id=str(folder)))
    assert np.abs(third.calibration.vectors - cached).max() < 1e-6  # type: ignore[attr-defined]


def test_int8_needs_dense_embeddings(tmp_path: Path) -> None:
    with app_client(splade_model(tmp_path / "splade")) as c:
        assert c.get("/info").json()["model"]["calibration"] is None
        r = c.post("/", json={"inputs": "a", "encoding_format": "int8"})
        assert r.status_code == 422 and "calibrated ranges" in r.json()["error"], r.text
        ok = c.post("/", json={"inputs": "a", "encoding_format": "ubinary"})
        assert ok.status_code == 200


# -- the width a model emits -------------------------------------------------------------------
def test_a_model_that_projects_in_its_forward_refuses_wider_cuts(tmp_path: Path) -> None:
    """OPT-350m's layout: its config's hidden size (32 here) is not what its forward emits
    (PROJECTED): /info says what it emits, and every `dimensions` between the two is a 422 on
    every route (it was a 500: the cut failed in the model's thread)."""
    folder = sentence_model(tmp_path / "opt", "opt-projected", ("mean",))
    st = SentenceTransformer(str(folder), device="cpu")
    expected = st.encode(TEXTS)
    hidden = AutoConfig.from_pretrained(str(folder)).hidden_size
    assert expected.shape[1] == PROJECTED < hidden
    with app_client(folder) as c:
        assert c.get("/info").json()["model"]["dimension"] == PROJECTED
        document = c.get("/openapi.json").json()["components"]["schemas"]
        assert document["EmbedRequest"]["properties"]["dimensions"]["anyOf"][0]["maximum"] == 24
        for dims in (PROJECTED + 1, 32):
            for path, body in (
                ("/embed", {"inputs": "a", "dimensions": dims}),
                ("/v1/embeddings", {"input": "a", "dimensions": dims}),
                ("/", {"inputs": "a", "dimensions": dims}),
                ("/v2/embed", {"texts": ["a"], "output_dimension": dims}),
            ):
                r = c.post(path, json=body)
                assert r.status_code == 422, (path, dims, r.text)
                assert f"the {PROJECTED} dimensions this model emits" in r.text
        full = c.post("/embed", json={"inputs": TEXTS, "dimensions": PROJECTED})
        assert np.abs(np.asarray(full.json()) - expected).max() < 1e-4
