"""Where a padded batch's real tokens lie, and attention over the packed rows.

A padded batch [B, L] holds T real tokens (T <= B x L; the attention mask's ones). Packed, the
token-wise parts of an encoder (embeddings, projections, feed-forward, layer norms) run on the
[T, H] rows of those tokens only; attention is the one part that must see each sequence apart,
so `Packing.attend` scatters the packed queries, keys and values into a padded [B, heads, L, d]
just for `torch.nn.functional.scaled_dot_product_attention` with a key mask, and gathers the
real rows back. Its cost stays B x L^2 per head (padded), the rest follows T.

Rows are taken in the padded batch's row-major order, so sequence i's tokens are contiguous
and in order whichever side the tokenizer pads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Packing:
    """The real tokens of a padded [B, L] batch: `rows` [T] (int64) index the flattened
    B x L positions; `key_mask` [B, 1, 1, L] (bool) says which keys each query may attend to;
    `full`: no padding at all (every row is L long), so packing is a reshape."""

    batch: int
    width: int
    rows: Any
    key_mask: Any
    full: bool

    @classmethod
    def of(cls, attention_mask: Any) -> Packing:
        """From the padded batch's attention mask [B, L] (1: a real token, 0: padding)."""
        mask = attention_mask.bool()
        batch, width = (int(n) for n in mask.shape)
        rows = mask.reshape(-1).nonzero().squeeze(1)
        full = int(rows.numel()) == batch * width
        return cls(batch, width, rows, mask[:, None, None, :], full)

    @property
    def tokens(self) -> int:
        """T: the real tokens (what the token-wise parts compute)."""
        return int(self.rows.numel())

    def pack(self, padded: Any) -> Any:
        """[B, L, ...] -> [T, ...]: the real tokens' rows, in order."""
        flat = padded.reshape(self.batch * self.width, *padded.shape[2:])
        return flat if self.full else flat.index_select(0, self.rows)

    def unpack(self, packed: Any) -> Any:
        """[T, ...] -> [B, L, ...], zeros at padding."""
        if self.full:
            return packed.reshape(self.batch, self.width, *packed.shape[1:])
        out = packed.new_zeros(self.batch * self.width, *packed.shape[1:])
        out.index_copy_(0, self.rows, packed)
        return out.reshape(self.batch, self.width, *packed.shape[1:])

    def attend(
        self, q: Any, k: Any, v: Any, heads: int, scale: float, bias: Any | None = None
    ) -> Any:
        """Multi-head attention of each sequence to its own real tokens.

        `q`, `k`, `v`: packed projections [T, heads x d]; `bias`: an additive attention bias
        broadcast to [B, heads, L, L] (MPNet's relative positions), or None; `scale`: the
        factor on q.k (1/sqrt(d) in these models). Returns the packed context [T, heads x d].
        Scaled dot-product attention as in Vaswani et al. 2017, "Attention is all you need".
        """
        import torch
        import torch.nn.functional as F

        width = int(q.shape[-1])
        shape = (self.batch, self.width, heads, width // heads)
        qh, kh, vh = (self.unpack(x).view(shape).transpose(1, 2) for x in (q, k, v))
        mask: Any = None if self.full else self.key_mask
        if bias is not None:
            mask = bias.to(q.dtype)
            if not self.full:
                blocked = mask.new_tensor(torch.finfo(q.dtype).min)
                mask = torch.where(self.key_mask, mask, blocked)
        context = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        return self.pack(context.transpose(1, 2).reshape(self.batch, self.width, width))
