"""Tiny BERT models for tests, built from a config and a generated WordPiece vocabulary.

They load through the same `MODEL_ID=<folder>` path users use. Weights are random (seeded), so
answers are deterministic but meaningless; tests compare them with direct pipeline calls.
The tokenizer is saved without `model_max_length`, so the token limit must come from the model
config (`max_position_embeddings`), as CASES.md C01 asks.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (  # noqa: SIM905  (a sentence reads better than a column of words)
    "paris is the capital of france this an example a sentence with some words and more text "
    "berlin germany rome italy city river big small good bad happy sad model test hello world "
    "john lives in london works at acme on monday"
).split()
MAX_POSITIONS = 512

TEXT_LABELS = {0: "NEGATIVE", 1: "NEUTRAL", 2: "POSITIVE"}
TOKEN_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def vocabulary() -> list[str]:
    """Specials, whole words, single characters and their `##` continuations (so any ASCII
    word tokenizes without [UNK])."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    return SPECIAL + sorted(set(WORDS)) + chars + [f"##{c}" for c in chars]


def build(kind: str, folder: Path, seed: int = 0) -> Path:
    """Write a tiny model of `kind` ("fill-mask", "text-classification",
    "token-classification") into `folder` and return it."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertTokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    labels = {"text-classification": TEXT_LABELS, "token-classification": TOKEN_LABELS}.get(kind)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        **({"id2label": labels, "label2id": {v: k for k, v in labels.items()}} if labels else {}),
    )
    torch.manual_seed(seed)
    model_class = {
        "fill-mask": BertForMaskedLM,
        "text-classification": BertForSequenceClassification,
        "token-classification": BertForTokenClassification,
    }[kind]
    model_class(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _forget_model_max_length(folder)
    return folder


def _forget_model_max_length(folder: Path) -> None:
    import json

    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("model_max_length", None)
    config_file.write_text(json.dumps(config))
