"""Tiny models of each embedding family, saved by sentence-transformers' own classes.

Each builder writes a backbone (random, seeded) with the tests' WordPiece tokenizer
(`models.vocabulary`: the architecture is what matters, not the tokenizer's kind), wraps it in
sentence-transformers modules (`Transformer`, `Pooling`, `Dense`, `Normalize`,
`SpladePooling`) and saves the model with `SentenceTransformer.save` / `SparseEncoder.save`,
so the folder layout is the installed sentence-transformers' (6.x). `as_5x` rewrites a saved
folder's modules.json with the 5.x class paths, as older folders on the hub have them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import MAX_POSITIONS, vocabulary

HIDDEN = 32
PROJECTED = 24  # what an opt-projected backbone emits
# 5.x class paths (what `sentence_transformers.util.deprecated_import` maps to 6.x's).
ST5_PATHS = {
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Dense": "sentence_transformers.models.Dense",
    "Normalize": "sentence_transformers.models.Normalize",
    "MLMTransformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling",
}


def _tokenizer(folder: Path, padding_side: str = "right") -> Any:
    from transformers import BertTokenizer

    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True, padding_side=padding_side)
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["padding_side"] = padding_side
    config["model_max_length"] = 128
    config_file.write_text(json.dumps(config))
    return tokenizer


def backbone(kind: str, folder: Path, seed: int = 0) -> Path:
    """A tiny random backbone of `kind` (bert, bert-mlm, modernbert, xlm-roberta, mpnet, qwen3,
    gemma3, gemma3-bidirectional, opt-projected: an OPT decoder whose forward projects its
    HIDDEN-wide states down to PROJECTED, as OPT-350m does) with the WordPiece tokenizer,
    saved in `folder`."""
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(folder, "left" if kind == "qwen3" else "right")
    n = len(tokenizer)
    small: dict[str, Any] = {
        "vocab_size": n,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": MAX_POSITIONS,
        "pad_token_id": tokenizer.pad_token_id,
    }
    decoder = {"num_key_value_heads": 1, "head_dim": 16}
    built: dict[str, Any] = {
        "bert": lambda: t.BertModel(t.BertConfig(**small)),
        "bert-mlm": lambda: t.BertForMaskedLM(t.BertConfig(**small)),
        "xlm-roberta": lambda: t.XLMRobertaModel(t.XLMRobertaConfig(**small)),
        "mpnet": lambda: t.MPNetModel(t.MPNetConfig(**small)),
        "modernbert": lambda: t.ModernBertModel(
            t.ModernBertConfig(
                **small,
                cls_token_id=tokenizer.cls_token_id,
                sep_token_id=tokenizer.sep_token_id,
                bos_token_id=tokenizer.cls_token_id,
                eos_token_id=tokenizer.sep_token_id,
            )
        ),
        "qwen3": lambda: t.Qwen3Model(t.Qwen3Config(**small, **decoder)),
        "gemma3": lambda: t.Gemma3TextModel(t.Gemma3TextConfig(**small, **decoder)),
        "opt-projected": lambda: t.OPTModel(
            t.OPTConfig(
                vocab_size=n,
                hidden_size=HIDDEN,
                word_embed_proj_dim=PROJECTED,
                num_hidden_layers=2,
                num_attention_heads=2,
                ffn_dim=64,
                max_position_embeddings=MAX_POSITIONS,
                pad_token_id=tokenizer.pad_token_id,
                do_layer_norm_before=False,  # OPT-350m's: the output projection applies
            )
        ),
        "gemma3-bidirectional": lambda: t.Gemma3TextModel(
            t.Gemma3TextConfig(**small, **decoder, use_bidirectional_attention=True)
        ),
    }
    torch.manual_seed(seed)
    built[kind]().eval().save_pretrained(folder)
    return folder


def sentence_model(
    folder: Path,
    kind: str,
    modes: tuple[str, ...],
    dense: tuple[tuple[int, str], ...] = (),
    *,
    normalize: bool = True,
    seed: int = 0,
    base: Path | None = None,
    **st_kwargs: Any,
) -> Path:
    """`SentenceTransformer([Transformer, Pooling, Dense(out, activation)..., Normalize])`
    saved in `folder`; `dense` lists each Dense module's (out_features, torch activation
    class name, e.g. "Tanh", "Identity", "GELU"). `base`: an existing backbone folder (e.g.
    the embedded all-MiniLM-L6-v2, for real compute) instead of a tiny `kind`."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    base = base or backbone(kind, folder.with_name(folder.name + "-backbone"), seed)
    transformer = Transformer(str(base))
    hidden = transformer.get_embedding_dimension()
    modules: list[Any] = [transformer, Pooling(hidden, pooling_mode=modes)]
    width = hidden * len(modes)
    torch.manual_seed(seed + 1)
    for out, activation in dense:
        modules.append(Dense(width, out, activation_function=getattr(torch.nn, activation)()))
        width = out
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", **st_kwargs)
    model.save(str(folder), create_model_card=False)
    return folder


def splade_model(
    folder: Path, strategy: str = "max", activation: str = "relu", *, legacy: bool = False
) -> Path:
    """`SparseEncoder([Transformer(fill-mask) or MLMTransformer, SpladePooling])` on a tiny
    BertForMaskedLM, saved in `folder` (`legacy`: the 5.x MLMTransformer module)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    base = backbone("bert-mlm", folder.with_name(folder.name + "-backbone"))
    first = (
        MLMTransformer(str(base))
        if legacy
        else Transformer(str(base), transformer_task="fill-mask")
    )
    pooling = SpladePooling(pooling_strategy=strategy, activation_function=activation)
    SparseEncoder(modules=[first, pooling], device="cpu").save(str(folder), create_model_card=False)
    return folder


def as_5x(folder: Path) -> Path:
    """Rewrite `folder`'s modules.json with sentence-transformers 5.x class paths."""
    modules_file = folder / "modules.json"
    modules = json.loads(modules_file.read_text())
    for module in modules:
        module["type"] = ST5_PATHS[module["type"].rsplit(".", 1)[-1]]
    modules_file.write_text(json.dumps(modules, indent=2))
    return folder
