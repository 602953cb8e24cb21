"""The checks `service.backends.ranking` applies to a candidate's output against torch
float32's, on torch tensors: the cosine of embeddings, classifier probabilities and top
labels, finiteness (the thresholds are `ranking`'s). Turning token rows into the vectors
compared is the engine's (`service.engine.backend_choice`)."""

from __future__ import annotations

from typing import Any

from service.backends.ranking import TIE, Quality


def vector_quality(reference: Any, output: Any) -> Quality:
    """Cosine of each row of `output` [B, D] to `reference`'s (lowest and mean over the rows);
    not finite when `output` holds NaN or inf."""
    import torch

    if not bool(torch.isfinite(output).all()):
        return Quality(finite=False)
    cos = torch.nn.functional.cosine_similarity(reference.double(), output.double(), dim=-1)
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
