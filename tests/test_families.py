"""Every embedding family against sentence-transformers, through every route (in-process).

Tiny models of each family are saved by sentence-transformers 6's own classes
(`family_models`): Dense heads (LaBSE-like: CLS -> Dense Tanh -> Normalize; EmbeddingGemma-like:
a bidirectional Gemma3 backbone, mean -> Dense up -> Dense down, Identity -> Normalize), the
families that were already exact (Qwen3 last-token with left padding, ModernBERT, XLM-R,
Gemma3) and SPLADE SparseEncoders (max and sum, relu and log1p_relu, 6.x Transformer and 5.x
MLMTransformer). Answers of `/embed`, `/embed_sparse`, `/v1/embeddings` (the openai SDK) and
`POST /` equal `SentenceTransformer.encode` / `SparseEncoder.encode` within 1e-4, for a list
of inputs in one request and for the same inputs sent one per request at once (they share
batches: the batch-size histogram says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from family_models import as_5x, sentence_model, splade_model
from helpers import app_client, batch_sizes
from schema_check import check_tei
from sentence_transformers import SentenceTransformer, SparseEncoder
from sentence_transformers.util import quantize_embeddings
from starlette.testclient import TestClient

from service.engine.folders import UnsupportedModel
from service.engine.loading.load import default_model_dir, infer_task, load_engine, preflight
from service.engine.loading.warmup import NonFiniteOutput
from service.settings import Settings

TOL = 1e-4
# 24 inputs of very different lengths (1 to ~120 tokens: the tiny tokenizer caps at 128).
TEXTS = [
    " ".join(["paris is the capital of france and berlin a big city"] * (i % 6 + 1))[: 7 + 23 * i]
    for i in range(24)
]
DENSE: dict[str, Callable[[Path], Path]] = {
    "labse": lambda d: sentence_model(d, "bert", ("cls",), ((32, "Tanh"),)),
    "labse-5x": lambda d: as_5x(sentence_model(d, "bert", ("cls",), ((32, "Tanh"),), seed=3)),
    "gemma-dense": lambda d: sentence_model(
        d, "gemma3-bidirectional", ("mean",), ((128, "Identity"), (32, "Identity"))
    ),
    "gelu-raw": lambda d: sentence_model(d, "bert", ("mean",), ((16, "GELU"),), normalize=False),
    "qwen3-lasttoken": lambda d: sentence_model(
        d, "qwen3", ("lasttoken",), prompts={"query": "query: "}, default_prompt_name="query"
    ),
    "modernbert": lambda d: sentence_model(d, "modernbert", ("mean",)),
    "xlm-roberta": lambda d: sentence_model(d, "xlm-roberta", ("mean",)),
    "gemma3": lambda d: sentence_model(d, "gemma3", ("mean",)),
    # Real compute: all-MiniLM-L6-v2's encoder with a seeded LaBSE-style head.
    "minilm-dense": lambda d: sentence_model(
        d, "bert", ("mean",), ((64, "Tanh"),), base=Path(default_model_dir())
    ),
}
SPARSE: dict[str, Callable[[Path], Path]] = {
    "splade-max": lambda d: splade_model(d, "max"),
    "splade-sum-5x": lambda d: splade_model(d, "sum", legacy=True),
    "splade-log1p": lambda d: as_5x(splade_model(d, "max", "log1p_relu")),
}


@pytest.fixture(scope="session")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build(root / name) for name, build in {**DENSE, **SPARSE}.items()}


def post_each(client: TestClient, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """POST each body at once (a thread each, so they meet in batches); all must be 200."""
    with ThreadPoolExecutor(len(bodies)) as threads:
        responses = list(threads.map(lambda b: client.post(path, json=b), bodies))
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json() for r in responses]


def sdk(client: TestClient) -> openai.OpenAI:
    """The openai SDK over the in-process app (TestClient is an httpx.Client)."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0
    )


def close(got: Any, expected: Any) -> float:
    diff = np.abs(np.asarray(got, dtype=np.float64) - np.asarray(expected, dtype=np.float64))
    return float(diff.max())


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# -- dense families ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", DENSE)
def test_dense_family_equals_encode_on_every_route(name: str, families: dict[str, Path]) -> None:
    folder = families[name]
    st = SentenceTransformer(str(folder), device="cpu")
    expected = st.encode(TEXTS)
    with app_client(folder, max_batch_wait_ms=20, truncate=True) as client:
        info = client.get("/info").json()["model"]
        assert info["dimension"] == st.get_embedding_dimension() == expected.shape[1]
        assert len(info["modules"]) == len(st)
        one = client.post("/embed", json={"inputs": TEXTS})
        assert one.status_code == 200, one.text
        assert close(one.json(), expected) < TOL, name
        shared_before = batch_sizes()[0]
        each = post_each(client, "/embed", [{"inputs": t} for t in TEXTS])
        assert batch_sizes()[0] > shared_before  # some of them shared a batch
        assert close([e[0] for e in each], expected) < TOL, name
        root = post_each(client, "/", [{"inputs": TEXTS}, *({"inputs": t} for t in TEXTS[:6])])
        assert close(root[0], expected) < TOL
        assert close([r[0] for r in root[1:]], expected[:6]) < TOL
        # OpenAI: unit length for every model, the raw one too.
        out = sdk(client).embeddings.create(model="m", input=TEXTS)
        assert close([d.embedding for d in out.data], unit(expected)) < TOL, name


def test_non_finite_embeddings_are_refused_at_start(
    families: dict[str, Path], tmp_path: Path
) -> None:
    """A Dense head that gives NaN (as EmbeddingGemma does in float16) is refused at start,
    in one line naming the dtype it ran in."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(families["labse"], tmp_path / "overflow")
    weights = folder / "2_Dense" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["linear.bias"] = torch.full_like(tensors["linear.bias"], float("nan"))
    save_file(tensors, str(weights))
    with pytest.raises(NonFiniteOutput, match=r"not finite \(NaN or inf\) in float32 on cpu"):
        load_engine(Settings(model_id=str(folder)))


# -- sparse families ---------------------------------------------------------------------------
def sparse_pairs(encoder: SparseEncoder, texts: list[str], **kw: Any) -> list[dict[int, float]]:
    rows = encoder.encode(texts, convert_to_sparse_tensor=False, **kw)
    return [{int(i): float(row[i]) for i in torch.nonzero(row).flatten()} for row in rows]


def assert_same_sparse(got: list[list[dict[str, Any]]], expected: list[dict[int, float]]) -> None:
    assert len(got) == len(expected)
    for answer, reference in zip(got, expected, strict=True):
        indices = [p["index"] for p in answer]
        assert indices == sorted(reference)  # same non-zero entries, ascending
        assert close([p["value"] for p in answer], [reference[i] for i in indices]) < TOL


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_family_equals_encode(name: str, families: dict[str, Path]) -> None:
    folder = families[name]
    encoder = SparseEncoder(str(folder), device="cpu")
    expected = sparse_pairs(encoder, TEXTS)
    assert infer_task(str(folder), Settings()) == "feature-extraction"  # never fill-mask
    with app_client(folder, max_batch_wait_ms=20, truncate=True) as client:
        info = client.get("/info").json()["model"]
        assert info["sparse"] is True and info["dimension"] == encoder.get_embedding_dimension()
        assert info["modules"][-1].startswith("SpladePooling")
        one = client.post("/embed_sparse", json={"inputs": TEXTS})
        assert one.status_code == 200, one.text
        check_tei("EmbedSparseResponse", one.json())
        assert_same_sparse(one.json(), expected)
        each = post_each(client, "/embed_sparse", [{"inputs": t} for t in TEXTS])
        assert_same_sparse([e[0] for e in each], expected)
        top = client.post("/embed_sparse", json={"inputs": TEXTS[:4], "max_active_dims": 5})
        assert_same_sparse(top.json(), sparse_pairs(encoder, TEXTS[:4], max_active_dims=5))
        dense = client.post("/", json={"inputs": TEXTS[:4]}).json()  # the full vocabulary
        reference = encoder.encode(TEXTS[:4], convert_to_sparse_tensor=False).numpy()
        assert close(dense, reference) < TOL
        for path, body in (("/embed", {"inputs": "a"}), ("/v1/embeddings", {"input": "a"})):
            r = client.post(path, json=body)
            assert r.status_code == 424 and "SPLADE" in r.text, path


def test_pooling_splade_on_a_masked_lm(tiny_models: dict[str, Path]) -> None:
    """POOLING=splade serves a plain *ForMaskedLM folder as SparseEncoder([MLMTransformer,
    SpladePooling()]) encodes it; without it the folder stays fill-mask."""
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    folder = tiny_models["fill-mask"]
    assert infer_task(str(folder), Settings()) == "fill-mask"
    assert infer_task(str(folder), Settings(pooling="splade")) == "feature-extraction"
    encoder = SparseEncoder(modules=[MLMTransformer(str(folder)), SpladePooling()], device="cpu")
    expected = sparse_pairs(encoder, TEXTS[:8])
    with app_client(folder, pooling="splade", truncate=True) as client:
        answer = client.post("/embed_sparse", json={"inputs": TEXTS[:8]})
        assert answer.status_code == 200, answer.text
        assert_same_sparse(answer.json(), expected)


# -- output encodings --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["binary", "ubinary"])
def test_packed_encodings_equal_quantize_embeddings(fmt: str, families: dict[str, Path]) -> None:
    folder = families["gelu-raw"]  # 16 dims, unnormalized: signs as encode gives them
    st = SentenceTransformer(str(folder), device="cpu")
    expected = quantize_embeddings(st.encode(TEXTS), precision=fmt)  # type: ignore[arg-type]
    opened = quantize_embeddings(unit(st.encode(TEXTS)), precision=fmt)  # type: ignore[arg-type]
    dtype = np.int8 if fmt == "binary" else np.uint8
    with app_client(folder, truncate=True) as client:
        for path, body, key in (
            ("/embed", {"inputs": TEXTS, "encoding_format": fmt}, None),
            ("/", {"inputs": TEXTS, "encoding_format": fmt}, None),
            ("/v1/embeddings", {"input": TEXTS, "encoding_format": fmt}, "data"),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            rows = [d["embedding"] for d in r.json()["data"]] if key else r.json()
            got = np.array(rows, dtype=dtype)
            assert np.array_equal(got, expected if key is None else opened), path


def test_base64_is_float32_bytes(families: dict[str, Path]) -> None:
    import base64

    folder = families["labse"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:3])
    with app_client(folder) as client:
        for path in ("/embed", "/"):
            got = client.post(path, json={"inputs": TEXTS[:3], "encoding_format": "base64"})
            vectors = [np.frombuffer(base64.b64decode(s), "<f4") for s in got.json()]
            assert close(vectors, expected) < TOL, path
        out = sdk(client).embeddings.create(model="m", input=TEXTS[:3])  # the SDK's base64
        assert close([d.embedding for d in out.data], expected) < TOL


# -- the defects -------------------------------------------------------------------------------
def test_dimensions_cut_then_normalize_and_warn(families: dict[str, Path]) -> None:
    folder = families["gelu-raw"]
    full = SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:4])
    with app_client(folder) as client:
        out = client.post("/v1/embeddings", json={"input": TEXTS[:4], "dimensions": 8})
        vectors = np.array([d["embedding"] for d in out.json()["data"]])
        assert close(vectors, unit(full[:, :8])) < TOL
        assert close(np.linalg.norm(vectors, axis=1), np.ones(4)) < 1e-5
        assert out.headers["warning"].startswith('299 pipeline-server "dimensions 8 cuts')
        whole = client.post("/v1/embeddings", json={"input": "a", "dimensions": 16})
        assert whole.status_code == 200 and "warning" not in whole.headers
        for path, body in (
            ("/embed", {"inputs": "a"}),
            ("/", {"inputs": "a"}),
            ("/v1/embeddings", {"input": "a"}),
        ):
            for bad in (0, -1, 17, 10**12, 2.5, "8"):
                r = client.post(path, json={**body, "dimensions": bad})
                assert r.status_code == 422, (path, bad, r.text)


def test_matryoshka_widths_answer_without_warning(
    families: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    folder = shutil.copytree(families["labse"], tmp_path / "mrl")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16]}))
    with app_client(folder) as client:
        assert client.get("/info").json()["model"]["matryoshka_dimensions"] == [8, 16]
        assert "warning" not in client.post("/embed", json={"inputs": "a", "dimensions": 8}).headers
        assert "warning" in client.post("/embed", json={"inputs": "a", "dimensions": 12}).headers


def test_pooling_config_wider_than_the_model(families: dict[str, Path], tmp_path: Path) -> None:
    """A Pooling config naming 64 on a 32-wide model: /info says 32, and every `dimensions`
    between the two is a 422, not a 500."""
    import shutil

    folder = shutil.copytree(families["xlm-roberta"], tmp_path / "wide")
    config_file = folder / "1_Pooling" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "embedding_dimension": 64}))
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:2])
    with app_client(folder) as client:
        assert client.get("/info").json()["model"]["dimension"] == 32 == expected.shape[1]
        for dims in (33, 48, 64):
            assert (
                client.post("/embed", json={"inputs": "a", "dimensions": dims}).status_code == 422
            )
        assert close(client.post("/embed", json={"inputs": TEXTS[:2]}).json(), expected) < TOL


def test_zero_shot_without_parameters_names_candidate_labels(
    tiny_models: dict[str, Path],
) -> None:
    with app_client(tiny_models["zero-shot-classification"]) as client:
        for body in ({"inputs": "a text"}, {"inputs": "a text", "parameters": {}}):
            r = client.post("/", json=body)
            assert r.status_code == 422 and "candidate_labels" in r.json()["error"], r.text


# -- folders served or refused ------------------------------------------------------------------
def test_st6_chat_template_folder_is_refused_with_why(
    families: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    folder = shutil.copytree(families["qwen3-lasttoken"], tmp_path / "chat")
    config_file = folder / "sentence_bert_config.json"
    config = json.loads(config_file.read_text())
    message = {"method": "forward", "method_output_name": "last_hidden_state"}
    config["modality_config"] = {"message": message, "text": message}
    config_file.write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match=r"\['message', 'text'\].*chat template"):
        preflight(Settings(model_id=str(folder)))


def test_unsupported_dense_heads_are_named(families: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    custom = shutil.copytree(families["labse"], tmp_path / "custom")
    dense = custom / "2_Dense" / "config.json"
    config = json.loads(dense.read_text())
    dense.write_text(json.dumps({**config, "activation_function": "my_pkg.Swish"}))
    with pytest.raises(UnsupportedModel, match=r"Dense module \(2_Dense\).*my_pkg"):
        preflight(Settings(model_id=str(custom)))
    narrow = shutil.copytree(families["labse"], tmp_path / "narrow")
    pooling_file = narrow / "1_Pooling" / "config.json"
    pooled = json.loads(pooling_file.read_text())
    pooling_file.write_text(json.dumps({**pooled, "pooling_mode": ["cls", "mean"]}))
    with pytest.raises(UnsupportedModel, match=r"takes 32 features but pooling gives 64"):
        load_engine(Settings(model_id=str(narrow)))
