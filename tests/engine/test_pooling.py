"""Sentence embeddings (service.engine.pooling) against sentence-transformers itself.

Our path is what the server will do: tokenize the batch with the HF tokenizer as ST does, run
`AutoModel` on the padded batch, `pool`, `finish`. The reference is `SentenceTransformer(folder)
.encode` on the same folder: tiny random BERT folders for every pooling mode (built once per
session) and the embedded all-MiniLM-L6-v2 for real values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import app_client
from models import build_sentence_model
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoModel, AutoTokenizer

from service.engine.batching.policy import partition
from service.engine.folders import UnsupportedModel
from service.engine.forward.prompts import (
    configure_tokenizer,
    prompt_length,
    resolve_prompt,
    st_text,
)
from service.engine.loading.st_config import config_for_pooling, read_sentence_config
from service.engine.pooling.pool import finish, pool
from service.engine.pooling.sentence import MODES, SentenceConfig

LONG = " ".join(["paris is the capital of france and berlin is a big city"] * 30)  # > 256 tokens
TEXTS = [
    "hello",
    "Paris IS the capital of France",
    "john lives in london and works at acme on monday, a good and happy city",
    "  a sentence with some words  ",
    LONG,
]
# A BERT padded on the left gives a text other position ids, and so another embedding, in each
# batch length: SentenceTransformer's own answer for "hello" changes with what it is batched
# with. The server splits a request's inputs when padding costs more than a batch's overhead
# (`service.engine.batching.policy`, calibrated at start, at least 8 tokens), as it did once with
# TEXTS (LONG alone, the rest in a batch of 18 tokens against ST's 64). These lengths, 3-8
# tokens with the test tokenizer, differ too little for any split to pay, so server and ST pad
# them as one batch.
LEFT_PADDED_TEXTS = [
    "hello",
    "Paris IS the capital of France",
    "john lives in london",
    "  a sentence with some words  ",
    "the city is big",
]
PROMPTS = {"query": "query: ", "passage": "this is an example passage: "}
CASES: dict[str, dict[str, Any]] = {
    # every mode alone, raw (no normalize: scale errors show), prompt tokens left out
    **{mode: {"modes": (mode,), "normalize": False, "include_prompt": False} for mode in MODES},
    "mean+normalize": {"modes": ("mean",)},
    "cls+mean": {"modes": ("cls", "mean"), "default_prompt_name": "query"},
    "max+mean_sqrt_len_tokens": {"modes": ("max", "mean_sqrt_len_tokens"), "normalize": False},
    "legacy cls+max+mean": {"modes": ("cls", "max", "mean"), "legacy": True},
    "left padding": {
        "modes": ("cls", "weightedmean", "lasttoken", "mean"),
        "include_prompt": False,
        "padding_side": "left",
    },
    "do_lower_case": {"modes": ("mean",), "do_lower_case": True, "cased_tokenizer": True},
}
TOLERANCE = 1e-4


def st_tokenize(tokenizer: Any, texts: list[str]) -> dict[str, torch.Tensor]:
    """How the server tokenizes, as ST 6 does (tokenizer set up by `configure_tokenizer`)."""
    return dict(tokenizer(texts, padding=True, truncation="longest_first", return_tensors="pt"))


@dataclass
class Ours:
    """Our path on one folder: config, tokenizer and model loaded once."""

    config: SentenceConfig
    tokenizer: Any
    model: Any

    @classmethod
    def load(cls, folder: Path) -> Ours:
        config = read_sentence_config(folder)
        assert config is not None
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder).eval()
        configure_tokenizer(tokenizer, config, model.config.max_position_embeddings)
        return cls(config, tokenizer, model)

    def embed(
        self, texts: list[str], prompt_name: str | None = None, dimensions: int | None = None
    ) -> torch.Tensor:
        prompt = resolve_prompt(self.config, prompt_name)
        batch = st_tokenize(self.tokenizer, [st_text(t, self.config, prompt) for t in texts])
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
        lengths = None
        if not self.config.include_prompt:
            lengths = torch.full((len(texts),), prompt_length(self.tokenizer, prompt))
        pooled = pool(hidden, batch["attention_mask"], self.config.modes, lengths)
        return finish(pooled, normalize=self.config.normalize, dimensions=dimensions)


def reference(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


def max_diff(ours: torch.Tensor, st: Any) -> float:
    return float((ours - torch.as_tensor(st)).abs().max())


@pytest.fixture(scope="session")
def sentence_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sentence")
    return {
        name: build_sentence_model(root / f"m{i}", prompts=PROMPTS, **kwargs)
        for i, (name, kwargs) in enumerate(CASES.items())
    }


@pytest.fixture(scope="session")
def embedded(embedded_model: Path) -> tuple[Ours, SentenceTransformer]:
    return Ours.load(embedded_model), reference(embedded_model)


# -- equal to SentenceTransformer.encode ---------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_equals_sentence_transformers(case: str, sentence_models: dict[str, Path]) -> None:
    ours, st = Ours.load(sentence_models[case]), reference(sentence_models[case])
    side = CASES[case].get("padding_side", "right")
    assert ours.tokenizer.padding_side == st.tokenizer.padding_side == side
    for prompt_name in (None, "query", "passage"):
        expected = st.encode(TEXTS, prompt_name=prompt_name, convert_to_tensor=True)
        got = ours.embed(TEXTS, prompt_name)
        assert got.shape == (len(TEXTS), ours.config.dimension) == expected.shape
        assert max_diff(got, expected) < TOLERANCE, (case, prompt_name)


@pytest.mark.parametrize("case", CASES)
def test_the_server_answers_what_sentence_transformers_encodes(
    case: str, sentence_models: dict[str, Path]
) -> None:
    """Through the app (the engine's own tokenization, padded batch and pooling), for every
    pooling mode and layout above, with each prompt: equal to `encode` within 1e-4."""
    st = reference(sentence_models[case])
    texts = LEFT_PADDED_TEXTS if CASES[case].get("padding_side") == "left" else TEXTS
    if texts is LEFT_PADDED_TEXTS:  # one batch at the least overhead, as ST's
        lengths = sorted(len(ids) for ids in st.tokenizer(texts)["input_ids"])
        assert partition(lengths, max_size=32, max_tokens=None, overhead_tokens=8.0) == [(0, 5)]
    with app_client(sentence_models[case], max_batch_wait_ms=20) as client:
        for prompt_name in (None, "query", "passage"):
            body: dict[str, Any] = {"inputs": texts, "truncate": True}  # ST cuts silently
            if prompt_name is not None:
                body["prompt_name"] = prompt_name
            r = client.post("/", json=body)
            assert r.status_code == 200, r.text
            expected = st.encode(texts, prompt_name=prompt_name)
            assert max_diff(torch.tensor(r.json()), expected) < TOLERANCE, (case, prompt_name)


def test_embedded_model_equals_sentence_transformers(
    embedded: tuple[Ours, SentenceTransformer],
) -> None:
    ours, st = embedded
    texts = [*TEXTS, "The quick brown fox jumps over the lazy dog. " * 40]
    assert len(ours.tokenizer(texts[-1])["input_ids"]) > 256  # truncated to max_seq_length
    assert max_diff(ours.embed(texts), st.encode(texts, convert_to_tensor=True)) < TOLERANCE


def test_tokenization_matches_sentence_transformers(
    embedded: tuple[Ours, SentenceTransformer],
) -> None:
    ours, st = embedded
    texts = [*TEXTS, "query: " + LONG]
    got, expected = st_tokenize(ours.tokenizer, texts), st.preprocess(texts)
    assert got["input_ids"].shape == (len(texts), 256)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(got[key], expected[key]), key


def test_prompt_length_matches_sentence_transformers(
    embedded: tuple[Ours, SentenceTransformer],
) -> None:
    ours, st = embedded
    for prompt in ("query: ", "Represent this sentence for searching: ", "x"):
        expected = st.preprocess(["hello"], prompt=prompt)["prompt_length"]
        assert prompt_length(ours.tokenizer, prompt) == expected  # [CLS] + prompt, no [SEP]
    assert prompt_length(ours.tokenizer, "") == 0


def test_st6_saved_folder_keeps_its_limit_in_the_tokenizer(tmp_path: Path) -> None:
    """ST 6's own `save` writes no max_seq_length: the limit lives in the tokenizer config."""
    from sentence_transformers.base.modules import Normalize, Transformer

    base = build_sentence_model(tmp_path / "base", ("mean",), max_seq_length=None)
    transformer = Transformer(str(base), max_seq_length=48, do_lower_case=True)
    pooling = Pooling(32, pooling_mode=("weightedmean", "cls"), include_prompt=False)
    modules = [transformer, pooling, Normalize()]
    saved = SentenceTransformer(modules=modules, prompts={"query": "query: "}, device="cpu")
    saved.save(str(tmp_path / "st6"), create_model_card=False)
    ours = Ours.load(tmp_path / "st6")
    assert ours.config.max_seq_length is None and ours.tokenizer.model_max_length == 48
    assert ours.config.modes == ("weightedmean", "cls") and not ours.config.include_prompt
    expected = reference(tmp_path / "st6").encode(
        TEXTS, prompt_name="query", convert_to_tensor=True
    )
    assert max_diff(ours.embed(TEXTS, "query"), expected) < TOLERANCE


# -- pool on its own ----------------------------------------------------------------------


def padded_batch(left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token rows [4, 9, 8] with real lengths 9, 5, 2, 1; pads hold large garbage."""
    torch.manual_seed(1)
    hidden = torch.randn(4, 9, 8)
    mask = torch.zeros(4, 9, dtype=torch.long)
    for row, n in enumerate((9, 5, 2, 1)):
        (mask[row, 9 - n :] if left else mask[row, :n]).fill_(1)
    return hidden.masked_fill(mask.unsqueeze(-1) == 0, 1e6), mask


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("prompt", [0, 1, 2])
def test_pool_equals_st_pooling_module(left: bool, prompt: int) -> None:
    hidden, mask = padded_batch(left)
    st_pool = Pooling(8, pooling_mode=MODES, include_prompt=not prompt)
    expected = st_pool(
        {"token_embeddings": hidden, "attention_mask": mask, "prompt_length": prompt}
    )
    lengths = torch.full((4,), prompt) if prompt else None
    got = pool(hidden, mask, MODES, lengths)
    assert got.shape == (4, 8 * len(MODES)) and got.dtype == torch.float32
    # Even rows the prompt leaves empty agree (max: -inf; cls: position 0; others: zeros).
    assert torch.allclose(got, expected["sentence_embedding"], atol=1e-6)


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_pad_rows_never_change_a_real_row(left: bool) -> None:
    hidden, mask = padded_batch(left)
    lengths = torch.tensor([2, 1, 1, 0])
    batched = pool(hidden, mask, MODES, lengths)
    for row in range(4):
        real = mask[row].bool()
        alone = pool(
            hidden[row : row + 1, real], mask[row : row + 1, real], MODES, lengths[row : row + 1]
        )
        assert torch.allclose(batched[row], alone[0], atol=1e-5), row


def test_same_text_alone_or_beside_longer_texts(embedded: tuple[Ours, SentenceTransformer]) -> None:
    ours, _ = embedded
    alone = ours.embed(["hello world"])
    beside = ours.embed(["hello world", LONG, "a much longer sentence " * 20])
    assert float((alone[0] - beside[0]).abs().max()) < 1e-5


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_nan_pad_rows_never_reach_a_real_row(left: bool) -> None:
    """A decoder's fully masked left padding can give NaN rows: the answers are those of the
    same batch with finite pads (mean pooling multiplies by the mask, as ST does)."""
    hidden, mask = padded_batch(left)
    nan_pads = hidden.masked_fill(mask.unsqueeze(-1) == 0, float("nan"))
    lengths = torch.tensor([2, 1, 1, 0])
    got = pool(nan_pads, mask, MODES, lengths)
    expected = pool(hidden, mask, MODES, lengths)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.allclose(got.nan_to_num(), expected.nan_to_num(), atol=1e-6)


def test_pool_half_precision_is_float32_out() -> None:
    hidden, mask = padded_batch(left=False)
    got = pool(hidden.clamp(-10, 10).half(), mask, ("mean", "max"))
    assert got.dtype == torch.float32
    assert torch.allclose(got, pool(hidden.clamp(-10, 10).half().float(), mask, ("mean", "max")))


# -- finish -------------------------------------------------------------------------------


def test_finish_cuts_then_normalizes() -> None:
    x = torch.randn(3, 10)
    cut = finish(x, normalize=True, dimensions=4)
    assert cut.shape == (3, 4)
    assert torch.allclose(cut.norm(dim=1), torch.ones(3))
    assert torch.allclose(cut, torch.nn.functional.normalize(x[:, :4], p=2, dim=1))
    assert torch.equal(finish(x, normalize=False, dimensions=4), x[:, :4])
    assert torch.equal(finish(x, normalize=False, dimensions=None), x)
    for bad in (0, 11):
        with pytest.raises(ValueError, match=r"1\.\.10"):
            finish(x, normalize=True, dimensions=bad)


def test_dimensions_on_the_embedded_model(embedded: tuple[Ours, SentenceTransformer]) -> None:
    ours, st = embedded
    full = st.encode(TEXTS, convert_to_tensor=True)
    cut = ours.embed(TEXTS, dimensions=128)
    assert max_diff(cut, torch.nn.functional.normalize(full[:, :128], dim=1)) < TOLERANCE


# -- reading the config -------------------------------------------------------------------


def test_read_embedded_config(embedded_model: Path) -> None:
    config = read_sentence_config(embedded_model)
    assert config == SentenceConfig(
        modes=("mean",),
        dimension=384,
        include_prompt=True,
        normalize=True,
        max_seq_length=256,
        do_lower_case=False,
        prompts={"query": "", "document": ""},
        default_prompt_name=None,
        folder=str(embedded_model),
        declared_dimension=384,
    )
    assert config.modules() == ("Transformer", "Pooling(mean)", "Normalize")
    assert st_text(" Hi ", config, None) == " Hi "  # ST 6 neither strips nor lower-cases


def test_read_config_of_built_models(sentence_models: dict[str, Path]) -> None:
    legacy = read_sentence_config(sentence_models["legacy cls+max+mean"])
    assert legacy is not None and legacy.modes == ("cls", "max", "mean") and legacy.normalize
    assert legacy.dimension == 96 and legacy.prompts == {"document": "", **PROMPTS}
    raw = read_sentence_config(sentence_models["max+mean_sqrt_len_tokens"])
    assert raw is not None and not raw.normalize and raw.max_seq_length == 64
    prompted = read_sentence_config(sentence_models["cls+mean"])
    assert prompted is not None and prompted.default_prompt_name == "query"
    assert st_text("hi", prompted, None) == "query: hi" and st_text("hi", prompted, "") == "hi"


def test_plain_folder_has_no_sentence_config(tmp_path: Path) -> None:
    assert read_sentence_config(tmp_path) is None


def write_modules(folder: Path, modules: list[tuple[str, str]], pooling: object = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    entries = [{"idx": i, "name": str(i), "path": p, "type": t} for i, (p, t) in enumerate(modules)]
    (folder / "modules.json").write_text(json.dumps(entries))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = pooling or {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


TRANSFORMER = ("", "sentence_transformers.models.Transformer")
POOLING = ("1_Pooling", "sentence_transformers.models.Pooling")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("2_Router", "sentence_transformers.models.Router"), r"models\.Router \(in 2_Router\)"),
        (("2_Custom", "custom_st.MyPooling"), r"custom_st\.MyPooling \(in 2_Custom\)"),
        (("3_LayerNorm", "sentence_transformers.models.LayerNorm"), r"LayerNorm \(in 3_Lay"),
    ],
)
def test_unsupported_modules_are_named(tmp_path: Path, extra: tuple[str, str], named: str) -> None:
    folder = write_modules(tmp_path, [TRANSFORMER, POOLING, extra])
    with pytest.raises(UnsupportedModel, match=named + r".*not supported"):
        read_sentence_config(folder)


def test_unsupported_layouts_and_modes(tmp_path: Path) -> None:
    normalize = ("2_Normalize", "sentence_transformers.models.Normalize")
    with pytest.raises(UnsupportedModel, match="Transformer -> Normalize -> Pooling: only"):
        read_sentence_config(write_modules(tmp_path / "a", [TRANSFORMER, normalize, POOLING]))
    with pytest.raises(UnsupportedModel, match=r"modules\.json lists Transformer:"):
        read_sentence_config(write_modules(tmp_path / "b", [TRANSFORMER]))
    odd = {"embedding_dimension": 8, "pooling_mode": ["mean", "median"]}
    with pytest.raises(UnsupportedModel, match=r"'median' \(1_Pooling/config.json\)"):
        read_sentence_config(write_modules(tmp_path / "c", [TRANSFORMER, POOLING], odd))
    config = read_sentence_config(write_modules(tmp_path / "d", [TRANSFORMER, POOLING]))
    assert config is not None and config.modes == ("mean",) and not config.normalize
    tokens = write_modules(tmp_path / "e", [TRANSFORMER, POOLING, normalize])
    (tokens / "2_Normalize").mkdir()
    (tokens / "2_Normalize" / "config.json").write_text('{"module_input_name": "token_embeddings"}')
    with pytest.raises(UnsupportedModel, match=r"Normalize module \(2_Normalize\) on token rows"):
        read_sentence_config(tokens)
    reranker = write_modules(tmp_path / "f", [TRANSFORMER, POOLING])
    (reranker / "sentence_bert_config.json").write_text('{"transformer_task": "text-generation"}')
    with pytest.raises(UnsupportedModel, match="task text-generation"):
        read_sentence_config(reranker)


def test_config_for_pooling() -> None:
    assert config_for_pooling("cls", 32) == SentenceConfig(modes=("cls",), dimension=32)
    assert config_for_pooling("last-token", 8).modes == ("lasttoken",)  # TEI's spelling
    splade = config_for_pooling("splade", 8)
    assert splade.splade is not None and (splade.splade.strategy, splade.splade.activation) == (
        "max",
        "relu",
    )
    with pytest.raises(UnsupportedModel, match="'median' \\(POOLING\\)"):
        config_for_pooling("median", 8)


def test_unknown_prompt_name(embedded: tuple[Ours, SentenceTransformer]) -> None:
    from service.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"'nope'.*'document', 'query'"):
        resolve_prompt(embedded[0].config, "nope")


def test_do_lower_case_is_a_tokenizer_normalizer(sentence_models: dict[str, Path]) -> None:
    folder = sentence_models["do_lower_case"]
    ours, st = Ours.load(folder), reference(folder)
    got = st_tokenize(ours.tokenizer, TEXTS)["input_ids"]
    assert torch.equal(got, st.preprocess(TEXTS)["input_ids"])
    cased = st_tokenize(AutoTokenizer.from_pretrained(folder), TEXTS)["input_ids"]
    assert not torch.equal(got, cased)  # "Paris" is [UNK] to the cased vocabulary
