"""BGE-M3's three outputs from one forward of its encoder, as FlagEmbedding's `BGEM3FlagModel`
computes them (FlagEmbedding 1.4, `finetune/embedder/encoder_only/m3/modeling.py` and
`inference/embedder/encoder_only/m3.py`; Chen et al., 2024, "M3-Embedding").

A BGE-M3 folder is an encoder (XLM-R in BGE-M3, any BERT-like model here) with two torch
`Linear` state dicts beside it: `colbert_linear.pt` (hidden -> D, D the hidden size in
BGE-M3) and `sparse_linear.pt` (hidden -> 1). From the last hidden state h [L, H] of one
input (L: its tokens, [CLS] first):

- dense: h[0], L2-normalized (the CLS vector; `pooling.pool` and `pool.finish` make it);
- sparse (lexical weights): w_t = relu(sparse_linear(h_t)) per token; each token id's weight
  is the max of w over its positions; ids of the tokenizer's CLS, EOS, PAD and UNK tokens and
  weights that are not > 0 are dropped. Answered as a `SparseVector` over the vocabulary
  (FlagEmbedding answers a dict by id, in first-seen order: the same pairs);
- multi-vector (ColBERT vectors): colbert_linear(h_t) for t = 1 .. L-1 (every token but
  [CLS], the final separator included), each L2-normalized: [L-1, D].

float32. Inference thread only (torch imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from service.engine.folders import M3_HEADS, UnsupportedModel
from service.engine.pooling.sparse import SparseVector

if TYPE_CHECKING:
    import torch

#: The special tokens whose lexical weight FlagEmbedding drops, by `special_tokens_map` key.
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True, eq=False)
class M3Heads:
    """A BGE-M3 folder's two heads (float32, on the model's device) and what the lexical
    weights leave out."""

    colbert: Any  # torch.nn.Linear: hidden -> D
    sparse: Any  # torch.nn.Linear: hidden -> 1
    unused: frozenset[int]  # token ids whose weight is dropped
    vocab_size: int  # the sparse vectors' size

    @property
    def dimension(self) -> int:
        """The width of the multi-vector rows (D)."""
        return int(self.colbert.out_features)


def load_heads(folder: Path, hidden: int, tokenizer: Any, vocab_size: int, device: Any) -> M3Heads:
    """The heads saved in `folder` (`torch.save` of a `Linear.state_dict()`, as FlagEmbedding
    saves them), checked against the encoder's `hidden` size; raises `UnsupportedModel` for
    a file that is not such a state dict."""
    import torch

    colbert, sparse = (_linear(folder / name, hidden, torch) for name in M3_HEADS)
    if sparse.out_features != 1:
        raise UnsupportedModel(
            f"sparse_linear.pt maps {hidden} features to {sparse.out_features}: BGE-M3's "
            "lexical head gives one weight per token"
        )
    unused = set()
    for key in UNUSED_TOKENS:
        token = tokenizer.special_tokens_map.get(key)
        if token is not None:
            unused.add(int(tokenizer.convert_tokens_to_ids(token)))
    return M3Heads(
        colbert=colbert.to(device),
        sparse=sparse.to(device),
        unused=frozenset(unused),
        vocab_size=vocab_size,
    )


def _linear(path: Path, hidden: int, torch: Any) -> Any:
    tensors = torch.load(path, map_location="cpu", weights_only=True)
    weight = tensors.get("weight") if isinstance(tensors, dict) else None
    keys = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
    if weight is None or weight.ndim != 2 or set(tensors) - {"weight", "bias"}:
        raise UnsupportedModel(f"{path.name} is not a Linear state dict (keys: {keys})")
    if int(weight.shape[1]) != hidden:
        raise UnsupportedModel(
            f"{path.name} takes {int(weight.shape[1])} features but the encoder gives {hidden}"
        )
    layer = torch.nn.Linear(hidden, int(weight.shape[0]), bias="bias" in tensors)
    layer.load_state_dict({k: v.float() for k, v in tensors.items()})
    return layer.float().eval().requires_grad_(False)


def token_weights(hidden: torch.Tensor, heads: M3Heads) -> torch.Tensor:
    """relu(sparse_linear(hidden)): [B, L, H] -> float32 [B, L], one weight per token."""
    return heads.sparse(hidden.float()).squeeze(-1).relu()


def lexical_weights(weights: np.ndarray, ids: np.ndarray, heads: M3Heads) -> SparseVector:
    """One input's sparse vector from its tokens' `weights` [n] and `ids` [n] (its real tokens
    only): each kept id's largest weight, indices ascending."""
    keep = (weights > 0) & ~np.isin(ids, list(heads.unused))
    indices, slot = np.unique(ids[keep], return_inverse=True)
    values = np.zeros(len(indices), dtype=np.float32)
    np.maximum.at(values, slot, weights[keep].astype(np.float32))
    return SparseVector(indices=indices.astype(np.int64), values=values, size=heads.vocab_size)


def colbert_vectors(hidden: torch.Tensor, heads: M3Heads) -> torch.Tensor:
    """colbert_linear then L2-normalize, token by token: [B, L, H] -> float32 [B, L, D] (the
    caller keeps each input's rows 1 .. n-1)."""
    import torch.nn.functional as F

    return F.normalize(heads.colbert(hidden.float()), p=2, dim=-1)


def keep_top(vector: SparseVector, k: int | None) -> SparseVector:
    """The `k` largest weights of `vector` (ties: the lower index), indices ascending; all of
    them when k is None."""
    if k is None or k >= len(vector.indices):
        return vector
    order = np.argsort(-vector.values, kind="stable")[:k]
    kept = np.sort(order)
    return SparseVector(indices=vector.indices[kept], values=vector.values[kept], size=vector.size)
