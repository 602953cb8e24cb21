"""Tiny BERT models for tests, built from a config and a generated WordPiece vocabulary.

They load through the same `MODEL_ID=<folder>` path users use. Weights are random (seeded), so
answers are deterministic but meaningless; tests compare them with direct pipeline calls.
The tokenizer is saved without `model_max_length`, so the token limit must come from the model
config (`max_position_embeddings`), as CASES.md C01 asks.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (  # noqa: SIM905  (a sentence reads better than a column of words)
    "paris is the capital of france this an example a sentence with some words and more text "
    "berlin germany rome italy city river big small good bad happy sad model test hello world "
    "john lives in london works at acme on monday"
).split()
MAX_POSITIONS = 512

TEXT_LABELS = {0: "NEGATIVE", 1: "NEUTRAL", 2: "POSITIVE"}
NLI_LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}  # entailment not at 0
CROSS_ENCODER_LABELS = {0: "LABEL_0"}  # one logit: a relevance score (TEI's reranker)
TOKEN_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def vocabulary() -> list[str]:
    """Specials, whole words, single characters and their `##` continuations (so any ASCII
    word tokenizes without [UNK])."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    return SPECIAL + sorted(set(WORDS)) + chars + [f"##{c}" for c in chars]


def tiny_config(vocab_size: int, **extra: object) -> Any:
    """A two-layer BERT config, 32 wide: random weights, fast enough for every test."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        **extra,
    )


def build(kind: str, folder: Path, seed: int = 0) -> Path:
    """Write a tiny model of `kind` ("fill-mask", "text-classification",
    "token-classification", "zero-shot-classification": an NLI classifier, "cross-encoder": a
    sequence classifier with one label) into `folder` and return it."""
    import torch
    from transformers import (
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertTokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    labels = {
        "text-classification": TEXT_LABELS,
        "token-classification": TOKEN_LABELS,
        "zero-shot-classification": NLI_LABELS,
        "cross-encoder": CROSS_ENCODER_LABELS,
    }.get(kind)
    config = tiny_config(
        len(tokenizer),
        **({"id2label": labels, "label2id": {v: k for k, v in labels.items()}} if labels else {}),
    )
    torch.manual_seed(seed)
    model_class = {
        "fill-mask": BertForMaskedLM,
        "text-classification": BertForSequenceClassification,
        "cross-encoder": BertForSequenceClassification,
        "token-classification": BertForTokenClassification,
        "zero-shot-classification": BertForSequenceClassification,
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


POOLING_LEGACY_KEYS = {  # the booleans sentence-transformers < 6 writes, in its order
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def build_sentence_model(
    folder: Path,
    modes: tuple[str, ...],
    *,
    include_prompt: bool = True,
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    max_seq_length: int | None = 64,
    do_lower_case: bool = False,
    cased_tokenizer: bool = False,
    padding_side: str = "right",
    legacy: bool = False,
    seed: int = 0,
) -> Path:
    """Write a tiny sentence-transformers model (BertModel + tokenizer + the module files) into
    `folder`, as sentence-transformers saves one: `legacy` writes the pre-6 module type names and
    pooling booleans (as all-MiniLM-L6-v2 ships), else ST 6's names and `pooling_mode` list.
    `cased_tokenizer` saves a tokenizer that does not lower-case (for `do_lower_case`)."""
    import json

    import torch
    from transformers import BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=not cased_tokenizer)
    config = tiny_config(len(tokenizer))
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _forget_model_max_length(folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["padding_side"] = padding_side  # save_pretrained leaves it out
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    def write(name: str, content: object) -> None:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content, indent=2))

    prefix = "sentence_transformers.models." if legacy else "sentence_transformers."
    types = (
        ["Transformer", "Pooling", "Normalize"]
        if legacy
        else [
            "base.modules.transformer.Transformer",
            "sentence_transformer.modules.pooling.Pooling",
            "base.modules.normalize.Normalize",
        ]
    )
    paths = ["", "1_Pooling", "2_Normalize"][: 3 if normalize else 2]
    write(
        "modules.json",
        [
            {"idx": i, "name": str(i), "path": path, "type": prefix + kind}
            for i, (path, kind) in enumerate(zip(paths, types, strict=False))
        ],
    )
    if legacy:
        pooling: dict[str, object] = {"word_embedding_dimension": config.hidden_size}
        pooling |= {key: mode in modes for mode, key in POOLING_LEGACY_KEYS.items()}
    else:
        pooling = {"embedding_dimension": config.hidden_size, "pooling_mode": list(modes)}
    write("1_Pooling/config.json", {**pooling, "include_prompt": include_prompt})
    if normalize and not legacy:  # all-MiniLM-L6-v2 lists 2_Normalize but ships no folder
        write("2_Normalize/config.json", {"module_input_name": "sentence_embedding"})
    bert_config: dict[str, object] = {"do_lower_case": do_lower_case}
    if max_seq_length is not None:
        bert_config["max_seq_length"] = max_seq_length
    write("sentence_bert_config.json", bert_config)
    model_config: dict[str, object] = {
        "model_type": "SentenceTransformer",
        "prompts": prompts or {},
    }
    if default_prompt_name is not None:
        model_config["default_prompt_name"] = default_prompt_name
    write("config_sentence_transformers.json", model_config)
    return folder
