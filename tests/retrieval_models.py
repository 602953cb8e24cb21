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


def _marked_tokenizer(folder: Path, markers: bool = True) -> Any:
    from transformers import AddedToken, BertTokenizer

    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    if markers:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [AddedToken(m, normalized=False) for m in MARKERS]}
        )
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["model_max_length"] = 128
    config_file.write_text(json.dumps(config))
    return tokenizer


def bert_backbone(folder: Path, seed: int = 0, *, markers: bool = True) -> Path:
    """A two-layer BERT, 32 wide, with the marked tokenizer (`markers`: with `[Q]` and `[D]`;
    without, as a plain BERT that PyLate adds its own prefix tokens to)."""
    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _marked_tokenizer(folder, markers)
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
    token_pooling: dict[str, Any] | None = None,
    seed: int = 0,
    **mve_kwargs: Any,
) -> Path:
    """`MultiVectorEncoder([Transformer(**transformer), Dense(32 -> out, no bias, on token
    rows), MultiVectorMask(**mask) (None: no mask module), *extra_modules, Normalize (on token
    rows), HierarchicalTokenPooling(**token_pooling) (None: none)])`, saved in `folder`.
    `mve_kwargs` go to the MultiVectorEncoder (prompts, similarity_fn_name)."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import (
        HierarchicalTokenPooling,
        MultiVectorMask,
    )

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
    if token_pooling is not None:
        modules.append(HierarchicalTokenPooling(**token_pooling))
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
    # a token pooling module after the Normalize: documents keep about half their vectors,
    # the first two never merged
    "pooled": {
        "mask": {"skiplist_words": list(string.punctuation)},
        "token_pooling": {"pool_factor": 2, "num_protected_tokens": 2},
        "prompts": {"query": "[Q] ", "document": "[D] "},
    },
}


#: A chat template that renders the `query` and `document` roles (and `system`, `user`), as
#: published rerankers ship one (`chat_template.jinja`), ending in an assistant turn to read.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </{{ m['role'] }}> "
    "{% endfor %}<judge> yes or no ?"
)


def causal_backbone(folder: Path, *, chat_template: str | None = None, seed: int = 0) -> Path:
    """A tiny Qwen3ForCausalLM (two layers, 32 wide) with the WordPiece vocabulary plus "yes"
    and "no", and `chat_template` when given."""
    import torch
    from transformers import BertTokenizer, Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    words = list(dict.fromkeys([*vocabulary(), "yes", "no"]))
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).eval().save_pretrained(folder)
    return folder


def llm_reranker(
    folder: Path,
    *,
    chat_template: str | None = None,
    yes_only: bool = False,
    max_seq_length: int | None = 160,
    **ce_kwargs: Any,
) -> Path:
    """A `CrossEncoder` on a tiny causal LM, saved in `folder`: sentence-transformers' own
    default modules (Transformer text-generation -> LogitScore(yes, no), Sigmoid), or with
    `yes_only` a LogitScore on "yes" alone; `ce_kwargs` go to the CrossEncoder (prompts,
    default_prompt_name)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    base = causal_backbone(folder.with_name(folder.name + "-backbone"), chat_template=chat_template)
    if yes_only:
        transformer = Transformer(str(base), transformer_task="text-generation")
        yes = transformer.tokenizer.convert_tokens_to_ids("yes")
        model = CrossEncoder(
            modules=[transformer, LogitScore(true_token_id=yes)], device="cpu", **ce_kwargs
        )
    else:
        model = CrossEncoder(str(base), device="cpu", **ce_kwargs)
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    model.save(str(folder), create_model_card=False)
    return folder


#: The causal-LM rerankers the tests serve, by name.
LLM_RERANKER_KINDS: dict[str, dict[str, Any]] = {
    "pairs": {},  # no chat template: the tokenizer's pair encoding
    "chat": {"chat_template": CHAT_TEMPLATE},
    "chat-prompt-yes": {
        "chat_template": CHAT_TEMPLATE,
        "yes_only": True,
        "prompts": {"judge": "is the document relevant to the query ?"},
        "default_prompt_name": "judge",
    },
}
