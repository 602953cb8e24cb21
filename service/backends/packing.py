"""Where a padded batch's real tokens lie, and attention over the packed rows.

A padded batch [B, L] holds T real tokens (T <= B x L; the attention mask's ones). Packed, the
token-wise parts of an encoder (embeddings, projections, feed-forward, layer norms) run on the
[T, H] rows of those tokens only; attention is the one part that must see each sequence apart.
`Packing.attend` runs attention on groups of sequences of similar length, each group padded
only to its own longest (a key mask where its lengths differ): one group per sequence costs a
call each, one group for the batch pads every sequence to the longest
(attention is quadratic in it). `groups` trades the two with a greedy rule over the lengths
(`CALL_COST`). A group runs `torch.nn.functional.scaled_dot_product_attention`, or in
bfloat16, when it holds several sequences, two matrix products around a float32 softmax
(`_bfloat16_attention`): torch's fused CPU kernel took a large share
of a bfloat16 forward's time on short inputs for a small share of its FLOPs (docs/backends.md).
The layer's query, key and value come as one [T, 3 x H] projection, so a group reads its rows
with one gather and one copy into the heads' layout, and writes its context back with one scatter.

Rows are taken in the padded batch's row-major order, so sequence i's tokens are contiguous
and in order whichever side the tokenizer pads.

Shapes the kernels have seen (`buckets`): oneDNN, which runs torch's bfloat16 matrix products
on the CPU, compiles a kernel for each exact shape it meets (the [T, H] rows' projections and
feed-forward, GELU) and keeps it in its primitive cache. Packed, T changes with every batch,
so every batch compiled new kernels (the groups' bfloat16 products among
them). With buckets the packed rows are T rounded up (`token_bucket`: pad rows
copy row 0's token, are computed like any row and are cut off at the end; token-wise parts
never mix rows, and attention never reads them), so once each bucket's kernels are made
(`service.backends.packed.PackedForward.warm`) no batch compiles one. The groups' attention
products run in float32 (`_bfloat16_attention`), which compiles nothing per shape; a
sequence alone runs torch's fused kernel, likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# What one more attention call costs, in units of one query-key pair of one head (L^2 per
# sequence): measured here (AMD EPYC Zen 5, one thread, MiniLM's 12 x 32 heads) at about
# 40 us a call and 60 ns a pair, float32 and bfloat16 alike: 32^2 pairs.
CALL_COST = 32 * 32
# Attention scores a bfloat16 group computes at once (`_bfloat16_attention`): 2^20 (4 MiB in
# float32) ran faster than 2^16 and 2^18 (the measurements in its docstring).
SCORES_PER_STEP = 1 << 20


def token_bucket(n: int) -> int:
    """Packed rows for `n` real tokens: `n` rounded up to a multiple of 64 up to 2,048, past
    that to a thirty-second of the power of two at or above it (128 up to 4,096, 256 up to
    8,192, ...): fewer than 64 pad rows up to 2,048 tokens, fewer than n / 16 past that
    (about half of that on average); 32 buckets up to 2,048 and 16 a doubling past it."""
    if n <= 2048:
        return max(64, -(-n // 64) * 64)
    step = (1 << (n - 1).bit_length()) // 32
    return -(-n // step) * step


def tokens_up_to(n: int) -> list[int]:
    """Every `token_bucket` value up to `token_bucket(n)`."""
    out = [64]
    while out[-1] < token_bucket(n):
        out.append(token_bucket(out[-1] + 1))
    return out


@dataclass(frozen=True, eq=False)
class Group:
    """Sequences attended in one call: `first`/`last` their packed rows when they need no
    padding (one sequence, or a batch without any: a slice, nothing copied); else `gather`
    [g x width] packed rows to read (padding reads row 0, masked out), `scatter` [g x width]
    the packed rows to write back to (padding: row T, past the last), `key_mask`
    [g, 1, 1, width] (bool; None when the g sequences are equally long) and `key_bias` the
    same as an additive float32 mask (0, or float32's lowest)."""

    width: int
    count: int
    first: int = 0
    last: int = 0
    gather: torch.Tensor | None = None
    scatter: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    key_bias: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class Packing:
    """The real tokens of a padded [B, L] batch: `rows` [T] (int64) index the flattened
    B x L positions; `lengths` each sequence's real tokens; `full`: no padding at all (every
    row is L long, and no buckets), so packing is a reshape; `buckets`: `size` rows packed,
    `token_bucket(T)`, the last ones padding (see the module)."""

    batch: int
    width: int
    rows: torch.Tensor
    lengths: tuple[int, ...]
    full: bool
    buckets: bool = False

    @classmethod
    def of(cls, attention_mask: torch.Tensor, buckets: bool = False) -> Packing:
        """From the padded batch's attention mask [B, L] (1: a real token, 0: padding)."""
        mask = attention_mask.bool()
        batch, width = (int(n) for n in mask.shape)
        rows = mask.reshape(-1).nonzero().squeeze(1)
        lengths = tuple(int(n) for n in mask.sum(dim=1).tolist())
        full = int(rows.numel()) == batch * width and not buckets
        return cls(batch, width, rows, lengths, full, buckets)

    @property
    def tokens(self) -> int:
        """T: the real tokens."""
        return int(self.rows.numel())

    @cached_property
    def size(self) -> int:
        """The packed rows the token-wise parts compute: T, or its bucket."""
        return token_bucket(self.tokens) if self.buckets else self.tokens

    @cached_property
    def _padded_rows(self) -> torch.Tensor:
        """`rows`, then row 0 for each pad row up to `size`."""
        import torch

        pad = self.size - self.tokens
        return torch.cat([self.rows, self.rows.new_zeros(pad)]) if pad else self.rows

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [size, ...]: the real tokens' rows, in order (then pad rows)."""
        flat = padded.reshape(self.batch * self.width, *padded.shape[2:])
        return flat if self.full else flat.index_select(0, self._padded_rows)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[size, ...] -> [B, L, ...], zeros at padding."""
        packed = packed[: self.tokens]
        if self.full:
            return packed.reshape(self.batch, self.width, *packed.shape[1:])
        out = packed.new_zeros(self.batch * self.width, *packed.shape[1:])
        out.index_copy_(0, self.rows, packed)
        return out.reshape(self.batch, self.width, *packed.shape[1:])

    @cached_property
    def groups(self) -> tuple[Group, ...]:
        """The attention calls: sequences longest first; one joins the open group while
        padding it to that group's width wastes at most `CALL_COST` pairs (width^2 - n^2),
        else it opens a new one. A batch with no padding is one call."""
        import torch

        if self.full:
            return (Group(self.width, self.batch, 0, self.tokens),)
        starts = [0]
        for n in self.lengths:
            starts.append(starts[-1] + n)
        order = sorted(range(self.batch), key=lambda i: -self.lengths[i])
        members: list[list[int]] = []
        for i in order:
            if members and self.lengths[members[-1][0]] ** 2 - self.lengths[i] ** 2 <= CALL_COST:
                members[-1].append(i)
            else:
                members.append([i])
        out = []
        for group in members:
            width = self.lengths[group[0]]
            if len(group) == 1:
                out.append(Group(width, 1, starts[group[0]], starts[group[0] + 1]))
                continue
            gather = torch.zeros(len(group), width, dtype=torch.long)
            scatter = torch.full((len(group), width), self.tokens, dtype=torch.long)
            key_mask = torch.zeros(len(group), width, dtype=torch.bool)
            for j, i in enumerate(group):
                n = self.lengths[i]
                gather[j, :n] = scatter[j, :n] = torch.arange(starts[i], starts[i] + n)
                key_mask[j, :n] = True
            keys = None if bool(key_mask.all()) else key_mask[:, None, None, :]
            blocked = torch.finfo(torch.float32).min
            out.append(
                Group(
                    width,
                    len(group),
                    gather=gather.reshape(-1),
                    scatter=scatter.reshape(-1),
                    key_mask=keys,
                    key_bias=None
                    if keys is None
                    else torch.zeros(keys.shape).masked_fill_(~keys, blocked),
                )
            )
        return tuple(out)

    def attend(
        self, qkv: torch.Tensor, heads: int, scale: float, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Multi-head attention of each sequence to its own real tokens.

        `qkv`: the packed query, key and value projections side by side [T, 3 x heads x d];
        `bias`: an additive attention bias [1, heads, L, L] that depends on relative positions
        only (MPNet's), cut to each group's width, or None; `scale`: the factor on q.k
        (1/sqrt(d) in these models). Returns the packed context [size, heads x d] (zeros in
        pad rows). Scaled dot-product attention as in Vaswani et al. 2017, "Attention is all
        you need": torch's fused kernel, except for groups of several sequences in bfloat16
        (`_bfloat16_attention`)."""
        import torch
        import torch.nn.functional as F

        hidden = int(qkv.shape[-1]) // 3
        d = hidden // heads
        alone = len(self.groups) == 1 and self.groups[0].gather is None  # every row, in order
        alone = alone and self.size == self.tokens
        out: torch.Tensor | None = None
        if not alone:  # row T: where padding is written
            out = qkv.new_empty(max(self.size, self.tokens + 1), hidden)
            out[self.tokens :].zero_()
        for g in self.groups:
            manual = g.count > 1 and qkv.dtype == torch.bfloat16  # `_bfloat16_attention`
            if g.gather is None:  # [g, heads, width, d] views of the rows
                x = qkv[g.first : g.last].view(g.count, g.width, 3, heads, d)
                x = x.permute(2, 0, 3, 1, 4)
                x = x.contiguous() if manual else x
            else:  # one gather, one copy into [3, g, heads, width, d]
                x = qkv.index_select(0, g.gather).view(g.count, g.width, 3, heads, d)
                x = x.permute(2, 0, 3, 1, 4).contiguous()
            mask: torch.Tensor | None = g.key_mask
            if bias is not None:
                mask = bias[:, :, : g.width, : g.width].to(qkv.dtype)
                if g.key_mask is not None:
                    blocked = mask.new_tensor(torch.finfo(qkv.dtype).min)
                    mask = torch.where(g.key_mask, mask, blocked)
            if manual:
                context = _bfloat16_attention(x, g.key_bias if bias is None else mask, scale)
            else:
                context = F.scaled_dot_product_attention(
                    x[0], x[1], x[2], attn_mask=mask, scale=scale
                )
            flat = context.transpose(1, 2).reshape(g.count * g.width, hidden)
            if out is None:
                return flat
            if g.gather is None:
                out[g.first : g.last] = flat
            else:
                out.index_copy_(0, g.scatter, flat)
        assert out is not None  # `alone` is one group, returned above
        return out[: self.size]


def _bfloat16_attention(x: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(scale x q.k^T + mask) v for one group: `x` bfloat16 [3, g, heads, width, d]
    (query, key, value; contiguous); `mask` None or an additive bias that broadcasts to
    [g, heads, width, width]. Returns [g, heads, width, d] bfloat16.

    Two float32 matrix products around a float32 softmax, `SCORES_PER_STEP` scores at a time,
    on a float32 copy of the group's query, key and value. For a group of several short
    sequences this runs faster than torch's fused CPU kernel in bfloat16
    (`scaled_dot_product_attention`), with the same answers within bfloat16's precision. The
    products are float32 because bfloat16's (oneDNN's) compile a kernel for each new
    [g x heads, width, d] shape, where float32's compile nothing and cost the same on these
    shapes (docs/backends.md, shapes the kernels have seen). For a sequence alone the fused
    kernel is as fast or faster, so it keeps those.
    The key mask comes as an additive float32 one (0, or float32's lowest: the same softmax
    as filling those scores in), made once a batch (`Group.key_bias`): a broadcast
    `masked_fill_` over the scores cost several times the `add_`."""
    import torch

    _, count, heads, width, d = (int(n) for n in x.shape)
    out = x.new_empty(x.shape[1:])
    step = max(1, SCORES_PER_STEP // (heads * width * width))
    for start in range(0, count, step):
        part = slice(start, min(start + step, count))
        n = (part.stop - part.start) * heads
        q, k, v = (x[i, part].reshape(n, width, d).float() for i in range(3))
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)
        if mask is not None:
            grouped = scores.view(-1, heads, width, width)
            grouped.add_(mask if mask.shape[0] == 1 else mask[part])
        out[part].view(n, width, d).copy_(torch.bmm(scores.softmax(dim=-1), v))
    return out
