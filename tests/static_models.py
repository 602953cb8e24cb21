"""Tiny static embedding models, saved by sentence-transformers' own classes.

`static_model` builds a `StaticEmbedding` on the tests' WordPiece tokenizer
(`models.vocabulary`) with seeded random rows, optionally followed by `Normalize`, with query and
document prompts, and saves it with `SentenceTransformer.save`. `as_model2vec` rewrites its rows
in model2vec's layout (`embeddings`, `mapping`, per-token `weights`), which
`StaticEmbedding.load` folds back into one row per token id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import vocabulary

DIMENSION = 16
PROMPTS = {"query": "query: ", "document": "passage: "}


def _fast_tokenizer(folder: Path) -> Any:
    from transformers import BertTokenizer, BertTokenizerFast

    vocab = {token: i for i, token in enumerate(vocabulary())}
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(folder)
    return BertTokenizerFast.from_pretrained(folder)


def static_model(
    folder: Path, *, normalize: bool = True, seed: int = 0, dimension: int = DIMENSION
) -> Path:
    """A seeded StaticEmbedding (-> Normalize) with PROMPTS, saved in `folder`."""
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding

    tokenizer = _fast_tokenizer(folder.with_name(folder.name + "-tokenizer"))
    rows = np.random.default_rng(seed).standard_normal((len(tokenizer), dimension))
    modules: list[Any] = [StaticEmbedding(tokenizer, embedding_weights=rows.astype(np.float32))]
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, prompts=dict(PROMPTS)).save(str(folder))
    return folder


def as_model2vec(folder: Path, seed: int = 1) -> Path:
    """`folder`'s rows rewritten as model2vec saves a vocabulary-quantized model: `embeddings`
    (fewer rows than tokens), `mapping` (token id -> row) and per-token `weights`."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    rows = load_file(str(folder / "model.safetensors"))["embedding.weight"]
    rng = np.random.default_rng(seed)
    table = rows[: len(rows) // 2].copy()
    mapping = rng.integers(0, len(table), size=len(rows)).astype(np.int64)
    weights = rng.uniform(0.5, 1.5, size=len(rows)).astype(np.float32)
    save_file(
        {"embeddings": table, "mapping": mapping, "weights": weights},
        str(folder / "model.safetensors"),
    )
    return folder


def bare_model2vec(folder: Path) -> Path:
    """A model2vec `StaticModel` folder as model2vec saves it: config.json (`model_type:
    model2vec`), model.safetensors (`embeddings`) and tokenizer.json, no modules.json."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _fast_tokenizer(folder.with_name(folder.name + "-tokenizer"))
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    rows = np.random.default_rng(0).standard_normal((len(tokenizer), DIMENSION))
    save_file({"embeddings": rows.astype(np.float32)}, str(folder / "model.safetensors"))
    config = {"model_type": "model2vec", "architectures": ["StaticModel"], "normalize": True}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
