"""Pooling token rows into sentence vectors, as sentence-transformers' Pooling and Normalize do.

`pool` and `finish` import torch and run in the inference thread; the modes come from the folder's
config (`service.engine.loading.st_config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.engine.folders import UnsupportedModel
from service.engine.pooling.sentence import MODES

if TYPE_CHECKING:
    import torch


def pool(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    modes: tuple[str, ...],
    prompt_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool token rows [B, L, H] under `attention_mask` [B, L] into [B, H x len(modes)] float32.

    Equal to ST's Pooling on the same padded batch, right or left padded. `prompt_lengths` [B]
    (from `prompt_length`) leaves each row's first tokens out, counted from its first real
    token (include_prompt=False); weightedmean keeps the original position weights, cls takes
    the first token after the prompt. Pad rows never reach a real row's answer.
    """
    import torch

    h = hidden.float()  # ST accumulates half precision in float32 too
    mask = attention_mask.to(device=h.device, dtype=torch.bool)
    positions = torch.arange(mask.shape[1], device=h.device).unsqueeze(0)  # [1, L]
    first = mask.int().argmax(dim=1, keepdim=True)  # [B, 1]: left padding's offset
    if prompt_lengths is not None:
        mask = mask & (positions >= first + prompt_lengths.to(h.device).view(-1, 1))
    rows = torch.arange(h.shape[0], device=h.device)
    keep = mask.unsqueeze(-1)  # [B, L, 1]
    count = mask.sum(dim=1, keepdim=True).float().clamp(min=1e-9)  # [B, 1]
    out: list[torch.Tensor] = []
    for mode in modes:
        if mode == "cls":  # the first kept token
            out.append(h[rows, mask.int().argmax(dim=1)])
        elif mode == "max":
            out.append(h.masked_fill(~keep, float("-inf")).amax(dim=1))
        elif mode == "mean":
            out.append(_kept_sum(h, keep) / count)
        elif mode == "mean_sqrt_len_tokens":
            out.append(_kept_sum(h, keep) / count.sqrt())
        elif mode == "weightedmean":  # weight 1 on the first real token, 2 on the next, ...
            weights = ((positions - first + 1) * mask).float().unsqueeze(-1)
            zeroed = h.masked_fill(~keep, 0.0)
            out.append((zeroed * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":  # the last kept token; zeros when none is kept
            last = mask.shape[1] - 1 - mask.flip(1).int().argmax(dim=1)
            out.append(torch.where(keep[rows, last], h[rows, last], 0.0))
        else:
            raise UnsupportedModel(f"pooling mode {mode!r} is not supported; use {MODES}")
    return torch.cat(out, dim=-1)


def _kept_sum(h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The sum over L of `h` [B, L, H] where `keep` [B, L, 1] is True: [B, H].

    Multiplied by the mask, as ST's mean pooling does (a broadcast `masked_fill` took several
    times as long). A pad row that is not finite (a decoder's fully masked
    left padding can give NaN) would leak into that product, so a result that is not finite is
    summed again with the pad rows filled in."""
    summed = (h * keep).sum(dim=1)
    if bool(summed.isfinite().all()):
        return summed
    return h.masked_fill(~keep, 0.0).sum(dim=1)


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalize each row (ST's Normalize: `F.normalize(p=2, dim=-1)`, eps 1e-12)."""
    import torch.nn.functional as F

    return F.normalize(x, p=2, dim=-1)


def finish(x: torch.Tensor, *, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """Cut [B, D] to its first `dimensions` columns (Matryoshka), then L2-normalize if asked.

    Cut first, so a cut vector is unit length again, as OpenAI's `dimensions` answers (ST's
    `truncate_dim` cuts after its Normalize module, leaving shorter vectors). Raises ValueError
    for `dimensions` outside 1..D.
    """
    if dimensions is not None:
        if not 1 <= dimensions <= x.shape[-1]:
            raise ValueError(f"dimensions must be 1..{x.shape[-1]}, not {dimensions}")
        x = x[:, :dimensions]
    return normalize_rows(x) if normalize else x
