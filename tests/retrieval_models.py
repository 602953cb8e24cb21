"""Tiny retrieval models saved by sentence-transformers' own classes: multi-vector
(`MultiVectorEncoder`) folders and causal-LM rerankers (`CrossEncoder` on a `*ForCausalLM`).

Backbones are random (seeded) with the tests' WordPiece vocabulary (`models.vocabulary`),
plus ColBERT's `[Q]` and `[D]` markers as added special tokens (as ColBERT folders ship
them), so prompts such as `"[Q] "` tokenize to one marker.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from models import MAX_POSITIONS, vocabulary

HIDDEN = 32
MARKERS = ["[Q]", "[D]"]


def _marked_tokenizer(folder: Path) -> Any:
    from transformers import AddedToken, BertTokenizer

    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(m, normalized=False) for m in MARKERS]}
    )
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["model_max_length"] = 128
    config_file.write_text(json.dumps(config))
    return tokenizer


def bert_backbone(folder: Path, seed: int = 0) -> Path:
    """A two-layer BERT, 32 wide, with the marked tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _marked_tokenizer(folder)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
    )
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(folder)
    return folder


def multi_vector_model(
    folder: Path,
    *,
    out: int = 8,
    mask: dict[str, Any] | None = None,
    normalize: bool = True,
    transformer: dict[str, Any] | None = None,
    extra_modules: tuple[Any, ...] = (),
    seed: int = 0,
    **mve_kwargs: Any,
) -> Path:
    """`MultiVectorEncoder([Transformer(**transformer), Dense(32 -> out, no bias, on token
    rows), MultiVectorMask(**mask) (None: no mask module), Normalize (on token rows)])`, saved
    in `folder`. `mve_kwargs` go to the MultiVectorEncoder (prompts, similarity_fn_name)."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    base = bert_backbone(folder.with_name(folder.name + "-backbone"), seed)
    modules: list[Any] = [Transformer(str(base), **(transformer or {}))]
    torch.manual_seed(seed + 1)
    modules.append(
        Dense(
            HIDDEN,
            out,
            bias=False,
            activation_function=torch.nn.Identity(),
            module_input_name="token_embeddings",
        )
    )
    if mask is not None:
        modules.append(MultiVectorMask(**mask))
    modules.extend(extra_modules)
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    model = MultiVectorEncoder(modules=modules, device="cpu", **mve_kwargs)
    model.save(str(folder), create_model_card=False)
    return folder


#: The folders the multi-vector tests serve, by name.
MULTI_VECTOR_KINDS: dict[str, dict[str, Any]] = {
    # ColBERT's composition: [Q]/[D] markers, queries filled to 16 with [MASK] (not attended),
    # punctuation dropped from documents, MaxSim
    "colbert": {
        "mask": {"skiplist_words": list(string.punctuation)},
        "transformer": {
            "query_length": 16,
            "document_length": 40,
            "query_expansion": {"strategy": "fixed", "length": 16},
        },
        "prompts": {"query": "[Q] ", "document": "[D] "},
        "similarity_fn_name": "maxsim",
    },
    # a floor of 12 filled positions attended to, longer queries up to 24, MeanMaxSim; the
    # skiplist on both sides; documents keep only some ids
    "min-attend": {
        "mask": {
            "skiplist_words": [",", "."],
            "skiplist_tasks": ["query", "document"],
            "keep_only_token_ids": [
                vocabulary().index(w) for w in ("[CLS]", "[SEP]", "paris", "city", "river", "the")
            ],
        },
        "transformer": {
            "query_length": 24,
            "query_expansion": {"strategy": "min", "length": 12, "attend": True},
        },
        "similarity_fn_name": "meanmaxsim",
    },
    # no MultiVectorMask, no Normalize, no expansion: every attended token, raw
    "plain": {"mask": None, "normalize": False, "transformer": {"document_length": 24}},
}
