"""The checks `service.backends.ranking` applies, on torch tensors: pooled embeddings' cosine,
classifier probabilities and top labels, finiteness (see `choice` for the thresholds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.backends.ranking import TIE, Quality


def pooled(hidden: Any, mask: Any, modes: Sequence[str]) -> Any:
    """Sentence vectors [B, H * len(modes)] from token rows [B, L, H] and the mask [B, L]:
    `cls` the first row, `lasttoken` the last real row, `max` the masked maximum, every other
    mode the masked mean (mean_sqrt_len_tokens and weightedmean differ from it by a scale or
    by weights, which a cosine check reads alike)."""
    import torch

    m = mask.to(hidden.dtype).unsqueeze(-1)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(hidden[:, 0])
        elif mode == "lasttoken":
            last = mask.sum(1).clamp(min=1) - 1
            parts.append(hidden[torch.arange(hidden.shape[0]), last])
        elif mode == "max":
            parts.append(hidden.masked_fill(m == 0, -1e9).max(1).values)
        else:
            parts.append((hidden * m).sum(1) / m.sum(1).clamp(min=1))
    return torch.cat(parts, dim=-1)


def embedding_quality(reference: Any, output: Any, mask: Any, modes: Sequence[str]) -> Quality:
    """Cosine of each text's pooled vector to float32's (lowest and mean over the texts)."""
    import torch

    finite = bool(torch.isfinite(output).all())
    if not finite:
        return Quality(finite=False)
    a, b = pooled(reference.float(), mask, modes), pooled(output.float(), mask, modes)
    cos = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)
    return Quality(finite=True, min_cosine=float(cos.min()), mean_cosine=float(cos.mean()))


def classifier_quality(reference: Any, output: Any) -> Quality:
    """Softmax probabilities' largest difference to float32's, and whether each text keeps its
    top label wherever float32's two highest probabilities differ by more than `TIE`."""
    import torch

    finite = bool(torch.isfinite(output).all())
    if not finite:
        return Quality(finite=False)
    p, q = reference.float().softmax(-1), output.float().softmax(-1)
    diff = float((p - q).abs().max())
    kept = True
    if p.shape[-1] > 1:
        top2 = p.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > TIE
        kept = bool((p.argmax(-1) == q.argmax(-1))[clear].all())
    else:  # one logit (a reranker): its sigmoid is what is served
        diff = float((reference.float().sigmoid() - output.float().sigmoid()).abs().max())
    return Quality(finite=True, max_prob_diff=diff, top_label_kept=kept)
