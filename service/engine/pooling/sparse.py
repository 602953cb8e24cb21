"""Sparse (SPLADE) embeddings as sentence-transformers' `SparseEncoder` makes them.

A SPLADE model is a masked-LM transformer whose logits [B, L, vocab] are pooled over the
tokens: `SpladePooling` (`sentence_transformers.sparse_encoder.modules.splade_pooling`) masks
pad positions to 0, applies `log1p(relu(x))` (activation `relu`; `log1p_relu` applies
`log1p` once more: OpenSearch's models), then takes the max (SPLADE v2 and later) or the sum
(SPLADE v1) over the sequence. The result has one weight per vocabulary entry, nearly all
zero; answers carry only the non-zero entries, in index order.

`max_active_dims` keeps the k largest weights, as `SparseEncoder.encode(max_active_dims=k)`
does (`sentence_transformers.util.select_max_active_dims`: top-k by absolute value, ties as
`torch.topk` breaks them). Inference thread only (torch is imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Strategy = Literal["max", "sum"]
Activation = Literal["relu", "log1p_relu"]
STRATEGIES: tuple[Strategy, ...] = ("max", "sum")
ACTIVATIONS: tuple[Activation, ...] = ("relu", "log1p_relu")


@dataclass(frozen=True, kw_only=True)
class SpladeSpec:
    """How a SPLADE model pools its MLM logits (`SpladePooling`'s config)."""

    strategy: Strategy = "max"
    activation: Activation = "relu"


@dataclass(frozen=True, slots=True)
class SparseVector:
    """One sparse embedding: the non-zero entries of a [size] vector, indices ascending."""

    indices: np.ndarray  # int64 [nnz]
    values: np.ndarray  # float32 [nnz]
    size: int  # the vocabulary size

    def dense(self) -> np.ndarray:
        """The full float32 [size] vector (what `encode(convert_to_sparse_tensor=False)` gives)."""
        out = np.zeros(self.size, dtype=np.float32)
        out[self.indices] = self.values
        return out

    def pairs(self) -> list[dict[str, float | int]]:
        """TEI's `/embed_sparse` answer for one input: `[{"index", "value"}, ...]`."""
        return [
            {"index": int(i), "value": float(v)}
            for i, v in zip(self.indices.tolist(), self.values.tolist(), strict=True)
        ]


def splade_pool(
    logits: torch.Tensor, attention_mask: torch.Tensor, spec: SpladeSpec
) -> torch.Tensor:
    """[B, L, V] MLM logits under `attention_mask` [B, L] -> float32 [B, V] SPLADE weights.

    Equal to `SpladePooling.forward` (eval mode, no chunking): pads are zeroed before the
    activation, so they add 0 to a sum and never win a max over values >= 0."""
    import torch

    x = logits.float() * attention_mask.to(device=logits.device, dtype=torch.float32).unsqueeze(-1)
    x = x.relu_().log1p_()  # in place: x is a fresh [B, L, V] tensor, the batch's largest
    if spec.activation == "log1p_relu":
        x = x.log1p_()
    return x.amax(dim=1) if spec.strategy == "max" else x.sum(dim=1)


def keep_top(weights: torch.Tensor, k: int | None) -> torch.Tensor:
    """The k largest weights of each row [B, V] by absolute value, the rest zero
    (`select_max_active_dims`); unchanged when k is None."""
    import torch

    if k is None:
        return weights
    _, top = torch.topk(weights.abs(), k=min(k, weights.shape[-1]), dim=-1)
    kept = torch.zeros_like(weights)
    kept.scatter_(-1, top, weights.gather(-1, top))
    return kept


def to_sparse(row: torch.Tensor) -> SparseVector:
    """One row [V] as its non-zero entries."""
    values = row.detach().cpu().float().numpy()
    indices = np.flatnonzero(values)
    return SparseVector(indices=indices.astype(np.int64), values=values[indices], size=values.size)
