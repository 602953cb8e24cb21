"""Packed (padding-free) batches answer what padded batches answer (`service.backends.packed`).

Random batches of mixed lengths, seeded: float32 packed within 1e-5 of float32 padded (pooled
vectors, token rows, classifier and masked-LM logits); bfloat16 packed at a cosine >= 0.9995
to float32 padded (probabilities within 1e-3 for classifiers). First on bare transformers models
of each family and head, then through the encoder engine for every task it serves (embeddings,
token rows, SPLADE, classifiers, zero-shot pairs, rerankers) and on the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_models import backbone, sentence_model, splade_model
from models import WORDS, build

from service.backends.packed import PackedTorchBackend, torch_backend, unsupported
from service.backends.packing import Packing
from service.backends.torch_backend import TorchBackend
from service.engine.forward.encoder import EncoderEngine
from service.engine.jobs import PARAMS, Op, Unit
from service.engine.loading.choice.candidates import native_bf16
from service.engine.loading.load import load_engine
from service.settings import Settings

FLOAT32 = 1e-5
MIN_COSINE = 0.9995
MAX_PROB_DIFF = 1e-3


def random_batch(rng: random.Random, vocab: int, pad: int, size: int) -> dict[str, Any]:
    """`size` sequences of 2-60 random ids (never `pad`), right-padded, with a mask and
    token type ids (a second segment in about half of them)."""
    import torch

    lengths = [rng.randint(2, 60) for _ in range(size)]
    width = max(lengths)
    ids = torch.full((size, width), pad, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.long)
    types = torch.zeros((size, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.tensor(
            [rng.choice([t for t in range(3, vocab) if t != pad]) for _ in range(n)]
        )
        mask[i, :n] = 1
        if rng.random() < 0.5:
            types[i, n // 2 : n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def tiny(kind: str, head: str) -> Any:
    """A seeded random model of `kind` (bert, xlm-roberta, mpnet) with `head` (model,
    classifier, masked-lm): 2 layers, 32 wide, 2 heads, 100 tokens."""
    import torch
    import transformers as t

    configs = {"bert": t.BertConfig, "xlm-roberta": t.XLMRobertaConfig, "mpnet": t.MPNetConfig}
    prefix = {"bert": "Bert", "xlm-roberta": "XLMRoberta", "mpnet": "MPNet"}[kind]
    suffix = {
        "model": "Model",
        "classifier": "ForSequenceClassification",
        "masked-lm": "ForMaskedLM",
    }
    config = configs[kind](
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=1 if kind != "bert" else 0,
        num_labels=3,
    )
    torch.manual_seed(7)
    return getattr(t, prefix + suffix[head])(config).eval()


def pooled(output: Any, mask: Any) -> Any:
    """Mean over each sequence's real token rows: [B, L, H] -> [B, H]."""
    m = mask[..., None].float()
    return (output * m).sum(1) / m.sum(1)


def cosine(a: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


CASES = [
    (k, h) for k in ("bert", "xlm-roberta", "mpnet") for h in ("model", "classifier", "masked-lm")
]


@pytest.mark.parametrize("kind, head", CASES)
def test_packed_equals_padded_in_float32_on_random_batches(kind: str, head: str) -> None:
    model = tiny(kind, head)
    padded = TorchBackend(copy.deepcopy(model), "cpu")  # the model as loaded, untouched
    packed = PackedTorchBackend(model, "cpu")
    rng = random.Random(f"{kind}-{head}")
    for size in (1, 2, 7, 16):
        inputs = random_batch(rng, 100, model.config.pad_token_id, size)
        if kind == "mpnet":
            del inputs["token_type_ids"]
        mask = inputs["attention_mask"]
        a, b = padded.forward(inputs), packed.forward(inputs)
        assert a.shape == b.shape
        if head == "classifier":
            assert (a - b).abs().max() <= FLOAT32
            continue
        assert (pooled(a, mask) - pooled(b, mask)).abs().max() <= FLOAT32
        real = mask.bool()
        assert (a[real] - b[real]).abs().max() <= FLOAT32  # every real token's row
        assert not b[~real].any()  # padding rows are zeros, never read


@pytest.mark.parametrize("kind, head", CASES)
def test_fused_projections_leave_the_model_as_it_was(kind: str, head: str) -> None:
    """Packing fuses each layer's query, key and value weights; the model's own modules then
    read views of them: the same answers as before, and no more parameter memory."""
    model = tiny(kind, head)

    def storage_bytes() -> int:
        storages = {
            p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
        }
        return sum(storages.values())

    before, answers = storage_bytes(), TorchBackend(copy.deepcopy(model), "cpu")
    packed = PackedTorchBackend(model, "cpu")
    assert storage_bytes() == before
    inputs = random_batch(random.Random(kind), 100, model.config.pad_token_id, 5)
    if kind == "mpnet":
        del inputs["token_type_ids"]
    assert (TorchBackend(model, "cpu").forward(inputs) - answers.forward(inputs)).abs().max() == 0
    got, expected = packed.forward(inputs), answers.forward(inputs)
    if head != "classifier":  # token rows: the real ones (packed padding rows are zeros)
        real = inputs["attention_mask"].bool()
        got, expected = got[real], expected[real]
    assert (got - expected).abs().max() <= FLOAT32


@pytest.mark.parametrize("kind, head", CASES)
def test_packed_bfloat16_keeps_float32_answers(kind: str, head: str) -> None:
    import torch

    model = tiny(kind, head)
    reference = TorchBackend(model, "cpu")
    packed = PackedTorchBackend(copy.deepcopy(model).to(torch.bfloat16), "cpu")
    assert packed.dtype == "bfloat16" and packed.compute == "packed"
    inputs = random_batch(random.Random(kind + head), 100, model.config.pad_token_id, 12)
    if kind == "mpnet":
        del inputs["token_type_ids"]
    mask = inputs["attention_mask"]
    a, b = reference.forward(inputs), packed.forward(inputs)
    if head == "classifier":
        assert (a.softmax(-1) - b.softmax(-1)).abs().max() <= MAX_PROB_DIFF
    else:
        assert cosine(pooled(a, mask), pooled(b, mask)).min() >= MIN_COSINE


def test_packing_moves_rows_both_ways() -> None:
    import torch

    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    padded = torch.arange(12.0).reshape(3, 4)[..., None]
    packing = Packing.of(mask)
    assert packing.tokens == 8 and not packing.full
    assert packing.pack(padded)[:, 0].tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert packing.unpack(packing.pack(padded))[..., 0].tolist() == [
        [0, 1, 2, 0],
        [4, 0, 0, 0],
        [8, 9, 10, 11],
    ]
    assert Packing.of(torch.ones(2, 3)).full  # nothing to pack: a reshape


def test_attention_groups_sequences_of_similar_length_and_equals_one_padded_call() -> None:
    """Long sequences of different lengths attend alone, short ones together, and the answer
    is one padded SDPA's over the whole batch (with MPNet's kind of bias too)."""
    import torch
    import torch.nn.functional as F

    lengths = [88, 10, 12, 60, 11, 3]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    packing = Packing.of(mask)
    assert [(g.width, g.count) for g in packing.groups] == [(88, 1), (60, 1), (12, 4)]
    assert Packing.of(torch.ones(3, 7)).groups[0].count == 3  # no padding: one call
    torch.manual_seed(0)
    heads, width = 4, 32
    q, k, v = (torch.randn(packing.tokens, width) for _ in range(3))
    bias = torch.randn(1, heads, 88, 88)
    bias = bias + bias.transpose(-1, -2)  # any bias a sequence's own positions index
    for b in (None, bias):
        shape = (len(lengths), 88, heads, width // heads)
        qh, kh, vh = (packing.unpack(x).view(shape).transpose(1, 2) for x in (q, k, v))
        keys = mask.bool()[:, None, None, :]
        full = keys if b is None else torch.where(keys, b, torch.finfo(torch.float32).min)
        expected = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=full, scale=0.3)
        expected = packing.pack(expected.transpose(1, 2).reshape(len(lengths), 88, width))
        got = packing.attend(torch.cat([q, k, v], dim=1), heads=heads, scale=0.3, bias=b)
        assert (got - expected).abs().max() <= FLOAT32


def test_bfloat16_groups_of_several_attend_as_float32_does_within_its_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In bfloat16 a group of several sequences attends by two matrix products around a
    float32 softmax, a sequence alone by torch's fused kernel; every real row stays within
    bfloat16's precision of float32 attention, with a bias or without, and splitting a group
    into steps changes nothing."""
    import torch
    import torch.nn.functional as F

    from service.backends import packing as packing_module

    lengths = [88, 10, 12, 60, 11, 3, 12, 12]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    packing = Packing.of(mask)
    assert [(g.width, g.count) for g in packing.groups] == [(88, 1), (60, 1), (12, 6)]
    torch.manual_seed(1)
    heads, width = 4, 32
    qkv = torch.randn(packing.tokens, 3 * width)
    bias = torch.randn(1, heads, 88, 88)
    fused = 0
    sdpa = F.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal fused
        fused += 1
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    for b in (None, bias):
        expected = packing.attend(qkv, heads=heads, scale=0.3, bias=b)
        fused = 0
        got = packing.attend(qkv.bfloat16(), heads=heads, scale=0.3, bias=b).float()
        assert fused == 2  # the two sequences alone; the group of six by the products
        cosine = F.cosine_similarity(got, expected, dim=1)
        assert float(cosine.min()) >= 0.999
        assert float((got - expected).abs().max()) <= 0.05 * float(expected.abs().max())
        monkeypatch.setattr(packing_module, "SCORES_PER_STEP", heads * 12 * 12 * 4)  # 2 steps
        stepped = packing.attend(qkv.bfloat16(), heads=heads, scale=0.3, bias=b).float()
        monkeypatch.undo()
        monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
        assert torch.equal(stepped, got)


def test_models_it_cannot_pack_run_padded(tmp_path: Path) -> None:
    from transformers import AutoModel

    for kind in ("modernbert", "qwen3"):
        model = AutoModel.from_pretrained(backbone(kind, tmp_path / kind)).eval()
        assert f"model type {kind}" in str(unsupported(model))
        assert torch_backend(model, "cpu").compute == "padded"
    bert = AutoModel.from_pretrained(backbone("bert", tmp_path / "bert")).eval()
    assert unsupported(bert) is None and torch_backend(bert, "cpu").compute == "packed"


# -- through the encoder engine: every task it serves -----------------------------------------


def texts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def both(engine: Any) -> tuple[EncoderEngine, EncoderEngine]:
    """The engine on the padded float32 model, and the same on the packed one."""
    assert isinstance(engine, EncoderEngine)
    pipe = engine.pipe
    padded = EncoderEngine(pipe, engine.info, engine.sentence, TorchBackend(pipe.model, "cpu"))
    packed = EncoderEngine(
        pipe, engine.info, engine.sentence, PackedTorchBackend(pipe.model, "cpu")
    )
    return padded, packed


def compare(a: Any, b: Any, tolerance: float = FLOAT32) -> None:
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            compare(x, y, tolerance)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            compare(a[k], b[k], tolerance)
    elif isinstance(a, (str, int)):
        assert a == b
    elif hasattr(a, "indices"):  # a sparse vector
        assert np.array_equal(a.indices, b.indices)
        assert np.abs(a.values - b.values).max() <= tolerance
    else:
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= tolerance


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    return {
        "bert": sentence_model(root / "bert", "bert", ("mean",)),
        "xlm-roberta": sentence_model(root / "xlmr", "xlm-roberta", ("cls", "max")),
        "mpnet": sentence_model(root / "mpnet", "mpnet", ("mean",), ((16, "Tanh"),)),
        "splade": splade_model(root / "splade"),
        "classifier": build("text-classification", root / "classifier"),
        "nli": build("zero-shot-classification", root / "nli"),
        "reranker": build("cross-encoder", root / "reranker"),
    }


UNITS: dict[str, list[tuple[Op, dict[str, Any]]]] = {
    "bert": [(Op.EMBED, {}), (Op.ROWS, {}), (Op.EMBED, {"normalize": False})],
    "xlm-roberta": [(Op.EMBED, {}), (Op.ROWS, {})],
    "mpnet": [(Op.EMBED, {}), (Op.EMBED, {"dimensions": 8})],
    "splade": [(Op.SPARSE, {}), (Op.SPARSE, {"max_active_dims": 5})],
    "classifier": [(Op.LOGITS, {}), (Op.CLASSIFY, {"top_k": None})],
    "nli": [(Op.LOGITS, {})],
    "reranker": [(Op.LOGITS, {})],
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_engine_answers_packed_as_padded(folders: dict[str, Path], name: str) -> None:
    padded, packed = both(load_engine(Settings(model_id=str(folders[name]))))
    rng = random.Random(name)
    kinds = UNITS[name]
    for size in (1, 5, 17):
        words = texts(rng, 2 * size)
        units = []
        for i in range(size):
            op, params = kinds[i % len(kinds)]
            pair = words[size + i] if name in ("nli", "reranker") else None  # a (text, pair)
            units.append(Unit(op=op, text=words[i], pair=pair, params=PARAMS[op](**params)))
        compare(padded.run(padded.prepare_many(units)), packed.run(packed.prepare_many(units)))


@pytest.fixture(scope="module")
def minilm() -> EncoderEngine:
    engine = load_engine(Settings())  # the embedded all-MiniLM-L6-v2
    assert isinstance(engine, EncoderEngine)
    return engine


def corpus_batches(rng: random.Random) -> list[list[str]]:
    from loadtest.corpus import short_inputs

    inputs = [str(x) for x in short_inputs(200)]
    return [rng.sample(inputs, size) for size in (1, 9, 32)]


def test_minilm_packed_float32_equals_padded(minilm: EncoderEngine) -> None:
    padded, packed = both(minilm)
    for batch in corpus_batches(random.Random(1)):
        units = [Unit(op=Op.EMBED, text=t) for t in batch] + [Unit(op=Op.ROWS, text=batch[0])]
        a = padded.run(padded.prepare_many(units))
        b = packed.run(packed.prepare_many(units))
        compare(a, b)


@pytest.mark.skipif(
    not native_bf16(), reason="bfloat16 is emulated on this CPU (about 100x slower)"
)
def test_minilm_packed_bfloat16_keeps_float32_vectors(minilm: EncoderEngine) -> None:
    import torch

    pipe = minilm.pipe
    reduced = copy.deepcopy(pipe.model).to(torch.bfloat16)
    padded = EncoderEngine(pipe, minilm.info, minilm.sentence, TorchBackend(pipe.model, "cpu"))
    packed = EncoderEngine(pipe, minilm.info, minilm.sentence, PackedTorchBackend(reduced, "cpu"))
    for batch in corpus_batches(random.Random(2)):
        units = [Unit(op=Op.EMBED, text=t) for t in batch]
        a = np.stack(padded.run(padded.prepare_many(units)))
        b = np.stack(packed.run(packed.prepare_many(units)))
        assert (a * b).sum(-1).min() >= MIN_COSINE  # both normalized: the dot is the cosine


# -- what is served, and /info ------------------------------------------------------------------


def test_info_says_which_models_run_packed(folders: dict[str, Path], tmp_path: Path) -> None:
    from helpers import app_client

    with app_client(folders["bert"]) as client:
        backend = client.get("/info").json()["model"]["backend"]
    assert (backend["name"], backend["dtype"], backend["compute"]) == ("torch", "float32", "packed")
    assert backend["candidates"][0]["quality"]["passes"]  # checked against padded at start
    modern = load_engine(
        Settings(model_id=str(sentence_model(tmp_path / "m", "modernbert", ("mean",))))
    )
    summary = modern.info.summary()["backend"]
    assert modern.info.compute == summary["compute"] == "padded"
    assert "model type modernbert" in summary["padded_because"]
    fill_mask = load_engine(
        Settings(model_id=str(folders["splade"]), pooling="none", task="fill-mask")
    )
    assert fill_mask.info.compute == "padded"  # the pipeline's own forward


def test_a_packed_forward_that_fails_at_start_falls_back_to_padded(
    folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import captured_logs

    from service.backends import packed
    from service.engine.loading.choice import candidates

    def broken(self: Any, inputs: Any) -> Any:
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(packed.PackedForward, "__call__", broken)
    with captured_logs(candidates) as logs:
        engine = load_engine(Settings(model_id=str(folders["classifier"])))
    assert engine.info.compute == "padded"
    assert "no kernel" in engine.info.summary()["backend"]["padded_because"]
    (line,) = [x for x in logs if x["event"] == "packed_fallback"]
    assert "no kernel" in line["reason"]
