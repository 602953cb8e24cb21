"""Long inputs: LONG_INPUTS (refuse, truncate, chunk) and TRUNCATE, the windows rule, and
windows as inputs of their own in the batcher.

The chunk rule is computed here directly with transformers on all-MiniLM-L6-v2 (the tokenizer
without special tokens, windows of 256 - 2 tokens each wrapped in [CLS] ... [SEP], the model's
mean pooling per window, the mean weighted by window length, then L2), and the server's
answers are compared with it; truncation is compared with `SentenceTransformer.encode`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ServerProcess, app_client
from models import build_sentence_model
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.forming import BatchFormer
from service.engine.batching.queue import Item, WorkQueue
from service.engine.batching.running import BatchRunner
from service.engine.forward import windows
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.engine.params import EmbedParams
from service.engine.types import Engine, Prepared
from service.errors import DeadlineExceeded, InferenceFailed
from service.settings import Settings, load_settings

LONG = " ".join(
    f"Sentence number {i} talks about rivers, cities and their people." for i in range(120)
)
SHORT = "A short sentence."


def reference_chunked(folder: Path, text: str, limit: int = 256) -> np.ndarray:
    """The chunk rule for a mean-pooled, normalized BERT model, with transformers alone."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    size = limit - 2
    vectors, weights = [], []
    for start in range(0, len(ids), size):
        window = [tok.cls_token_id, *ids[start : start + size], tok.sep_token_id]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([window]))[0][0]
        vectors.append(hidden.mean(dim=0).numpy())
        weights.append(len(window))
    mean = np.average(np.stack(vectors).astype(np.float64), axis=0, weights=weights)
    return (mean / np.linalg.norm(mean)).astype(np.float32)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- settings ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, mode",
    [
        ({}, "refuse"),
        ({"TRUNCATE": "true"}, "truncate"),
        ({"TRUNCATE": "false"}, "refuse"),
        ({"LONG_INPUTS": "chunk"}, "chunk"),
        ({"LONG_INPUTS": "Truncate", "TRUNCATE": "1"}, "truncate"),
        ({"LONG_INPUTS": "chunk", "TRUNCATE": "false"}, "chunk"),
    ],
)
def test_long_inputs_mode_and_truncate(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], mode: str
) -> None:
    for name in ("LONG_INPUTS", "TRUNCATE"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    assert s.long_inputs == mode and s.truncate is (mode == "truncate")


# -- the windows rule, pure -------------------------------------------------------------------
def test_template_and_split_on_minilm(embedded_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_model)
    tpl = windows.template(tok)
    assert tpl == windows.Template(prefix=(tok.cls_token_id,), suffix=(tok.sep_token_id,))
    content = list(range(1000, 1010))
    split = windows.split(content, 6, tpl)  # 4 tokens of content per window
    assert split == [
        [tok.cls_token_id, 1000, 1001, 1002, 1003, tok.sep_token_id],
        [tok.cls_token_id, 1004, 1005, 1006, 1007, tok.sep_token_id],
        [tok.cls_token_id, 1008, 1009, tok.sep_token_id],
    ]
    with pytest.raises(ValueError, match="no room"):
        windows.split(content, 2, tpl)


def test_merge_weights_windows_by_length_then_normalizes() -> None:
    a, b = np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
    merged = windows.merge([a, b], weights=[3, 1], params=EmbedParams(normalize=False))
    assert merged == pytest.approx([0.75, 0.25])
    unit = windows.merge([a, b], weights=[3, 1], params=EmbedParams(count_tokens=True))
    assert unit.tokens == 4 and unit.answer == pytest.approx(np.array([3, 1]) / np.sqrt(10))
    cut = windows.merge([a, b], weights=[1, 1], params=EmbedParams(dimensions=1))
    assert cut == pytest.approx([1.0])


# -- windows in the batcher (no thread: the former and the runner driven by hand) ------------
@pytest.fixture(scope="module")
def small_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A tiny mean-pooled model whose limit is 16 tokens: a long text is a few windows."""
    folder = build_sentence_model(
        tmp_path_factory.mktemp("long") / "m", ("mean",), max_seq_length=16
    )
    return load_engine(Settings(model_id=str(folder)))


def chunked_item(text: str, deadline_s: float = 30) -> Item:
    params = EmbedParams(chunk=True)
    return Item(
        unit=Unit(op=Op.EMBED, text=text, params=params), deadline=time.monotonic() + deadline_s
    )


def admitted(engine: Engine, *items: Item) -> tuple[BatchFormer, WorkQueue]:
    queue = WorkQueue(64)
    estimate = ServiceTimeEstimate()
    queue.offer(list(items), estimate)
    former = BatchFormer(Settings(max_batch_size=32), queue, estimate)
    former.admit(engine, queue.take_new(0))
    return former, queue


def test_windows_are_inputs_of_their_own(small_engine: Engine) -> None:
    """A long input becomes its windows in the pool: counted in the queue depth one each,
    batched with the short input, and its answer is the merge of theirs."""
    long, short = chunked_item("paris is the capital of france " * 6), chunked_item("hello world")
    former, queue = admitted(small_engine, long, short)
    windows_n = len(former.pool) - 1
    assert windows_n == 3  # 36 tokens without specials, 14 a window
    assert queue.depth == windows_n + 1 and all(i.parent is long for i in former.pool[:-1])
    batch = former.next_batch(small_engine, BatchRunner(queue, ServiceTimeEstimate()).last)
    assert len(batch) == 4 and queue.depth == 0
    BatchRunner(queue, ServiceTimeEstimate()).run(small_engine, batch)
    got = long.future.result(1)
    parts = [p.prepared for p in batch if p.parent is long]
    pooled = small_engine.run([_plain(p) for p in parts if p is not None])
    weights = [p.n_tokens for p in parts if p is not None]
    mean = np.average(np.stack(pooled), axis=0, weights=weights)
    assert got == pytest.approx(mean / np.linalg.norm(mean), abs=1e-6)
    assert np.linalg.norm(short.future.result(1)) == pytest.approx(1.0, abs=1e-6)


def _plain(p: Prepared) -> Prepared:
    return Prepared(
        unit=Unit(op=Op.EMBED, text="", params=EmbedParams(normalize=False)),
        n_tokens=p.n_tokens,
        payload=p.payload,
    )


def test_a_cancelled_input_drops_its_windows(small_engine: Engine) -> None:
    long = chunked_item("paris is the capital of france " * 6)
    former, queue = admitted(small_engine, long)
    before = counter("pipeline_server_cancelled_total", reason="client_disconnect")
    assert long.future.cancel()  # the loop: the client left
    batch = former.next_batch(small_engine, BatchRunner(queue, ServiceTimeEstimate()).last)
    runner = BatchRunner(queue, ServiceTimeEstimate())
    runner.run(small_engine, batch)
    assert runner.last.size == 0  # nothing computed
    assert all(i.future.cancelled() for i in batch) and queue.depth == 0
    assert counter("pipeline_server_cancelled_total", reason="client_disconnect") == before + 3
    assert queue.occupancy.waiting == 0 and queue.occupancy.running == 0


def test_a_failing_window_fails_its_input_only(small_engine: Engine) -> None:
    class Exploding:
        info = small_engine.info

        def prepare_many(self, units: Any) -> Any:
            return small_engine.prepare_many(units)

        def prepare(self, unit: Unit) -> Prepared:
            return small_engine.prepare(unit)

        def run(self, batch: list[Prepared]) -> list[Any]:
            if any(not p.unit.params.chunk and p.n_tokens == 16 for p in batch):  # a window
                raise RuntimeError("boom")
            return small_engine.run(batch)

    long, short = chunked_item("paris is the capital of france " * 6), chunked_item("hello")
    former, queue = admitted(small_engine, long, short)
    batch = former.next_batch(small_engine, BatchRunner(queue, ServiceTimeEstimate()).last)
    BatchRunner(queue, ServiceTimeEstimate()).run(Exploding(), batch)  # type: ignore[arg-type]
    with pytest.raises(InferenceFailed):
        long.future.result(1)
    assert short.future.result(1).shape == (32,)
    assert queue.occupancy.waiting == 0 and queue.occupancy.running == 0


def test_an_expired_window_answers_504(small_engine: Engine) -> None:
    long = chunked_item("paris is the capital of france " * 6, deadline_s=0.05)
    former, queue = admitted(small_engine, long)
    time.sleep(0.1)
    batch = former.next_batch(small_engine, BatchRunner(queue, ServiceTimeEstimate()).last)
    BatchRunner(queue, ServiceTimeEstimate()).run(small_engine, batch)
    with pytest.raises(DeadlineExceeded):
        long.future.result(1)
    assert queue.depth == 0


# -- all-MiniLM-L6-v2, in-process: every embedding route ---------------------------------------
@pytest.fixture(scope="module")
def chunking(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model, long_inputs="chunk") as client:
        yield client


def test_chunk_mode_embeds_long_inputs_by_the_rule(
    chunking: TestClient, embedded_model: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    expected = reference_chunked(embedded_model, LONG)
    short = SentenceTransformer(str(embedded_model), device="cpu").encode([SHORT])[0]
    before = counter("pipeline_server_long_inputs_total", action="chunked")
    r = chunking.post("/embed", json={"inputs": [LONG, SHORT]})
    assert r.status_code == 200, r.text
    got = np.array(r.json(), dtype=np.float32)
    assert got[0] == pytest.approx(expected, abs=1e-5)
    assert got[1] == pytest.approx(short, abs=1e-5)  # a short input: as it is
    assert counter("pipeline_server_long_inputs_total", action="chunked") == before + 1
    openai = chunking.post("/v1/embeddings", json={"input": [LONG], "encoding_format": "float"})
    assert np.array(openai.json()["data"][0]["embedding"]) == pytest.approx(expected, abs=1e-5)
    usage = openai.json()["usage"]["prompt_tokens"]
    from transformers import AutoTokenizer

    content = len(
        AutoTokenizer.from_pretrained(embedded_model)(LONG, add_special_tokens=False)["input_ids"]
    )
    assert usage == content + 2 * -(-content // 254)  # every window's tokens, specials included
    root = chunking.post("/", json={"inputs": LONG})
    assert np.array(root.json()[0]) == pytest.approx(expected, abs=1e-5)
    similarity = chunking.post(
        "/similarity", json={"inputs": {"source_sentence": LONG, "sentences": [LONG]}}
    )
    assert similarity.json() == [pytest.approx(1.0, abs=1e-5)]


def test_a_request_overrides_the_mode(chunking: TestClient, embedded_model: Path) -> None:
    from sentence_transformers import SentenceTransformer

    refused = chunking.post("/embed", json={"inputs": [SHORT, LONG], "truncate": False})
    assert refused.status_code == 422
    assert refused.json()["error"].startswith("input is ")
    assert "takes at most 256 tokens" in refused.json()["error"]
    truncated = chunking.post("/embed", json={"inputs": LONG, "truncate": True})
    encoded = SentenceTransformer(str(embedded_model), device="cpu").encode([LONG])[0]
    assert np.array(truncated.json()[0]) == pytest.approx(encoded, abs=1e-5)
    hf = chunking.post("/", json={"inputs": LONG, "parameters": {"truncation": True}})
    assert np.array(hf.json()[0]) == pytest.approx(encoded, abs=1e-5)


def test_chunk_mode_refuses_what_has_no_windows(chunking: TestClient) -> None:
    """Token rows have no pooled vector to average: a long input is a 422 naming the way out."""
    r = chunking.post("/embed_all", json={"inputs": LONG})
    assert r.status_code == 422
    assert "LONG_INPUTS=chunk makes windows of pooled embeddings only" in r.json()["error"]


def test_info_states_the_mode_and_the_limit(chunking: TestClient) -> None:
    limits = chunking.get("/info").json()["limits"]
    assert limits["long_inputs"] == {"mode": "chunk", "max_input_tokens": 256}
    assert limits["truncate"] is False


# -- the real server ----------------------------------------------------------------------------
@pytest.mark.server
def test_real_server_chunks_truncates_and_refuses(start_server: Any, embedded_model: Path) -> None:
    from sentence_transformers import SentenceTransformer

    server: ServerProcess = start_server(LONG_INPUTS="chunk")
    default: ServerProcess = start_server(TRUNCATE="true")
    server.wait_ready()
    default.wait_ready()
    expected = reference_chunked(embedded_model, LONG)
    got = server.post("/embed", json={"inputs": [LONG, SHORT]}).json()
    assert np.array(got[0]) == pytest.approx(expected, abs=1e-5)
    assert server.post("/embed", json={"inputs": LONG, "truncate": False}).status_code == 422
    assert server.get("/info").json()["limits"]["long_inputs"]["mode"] == "chunk"
    encoded = SentenceTransformer(str(embedded_model), device="cpu").encode([LONG])[0]
    truncated = default.post("/embed", json={"inputs": LONG}).json()  # TRUNCATE=true still works
    assert np.array(truncated[0]) == pytest.approx(encoded, abs=1e-5)
    assert default.get("/info").json()["limits"]["long_inputs"]["mode"] == "truncate"
    metrics = default.get("/metrics").text
    assert 'pipeline_server_long_inputs_total{action="truncated"} 1.0' in metrics
