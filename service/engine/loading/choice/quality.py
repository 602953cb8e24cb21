"""The checks `auto` applies to a candidate's answers against torch float32's, one per output
kind the engine serves, on the fixed warm-up texts
(`service.engine.loading.choice.backend_choice.TEXTS`); a candidate that fails one is not served
(`service.engine.loading.choice.ranking`). On torch tensors; turning the model's first output into
the answers compared (pooling, SPLADE) is the engine's
(`service.engine.loading.choice.backend_choice`).

Every check also needs finite values (a float16 overflow fails). The bounds:
- pooled vectors: each text's cosine to float32's >= `MIN_COSINE` (0.9995; bfloat16 keeps
  0.9998 on all-MiniLM-L6-v2, onnxruntime float32 1 - 1e-12);
- token rows: each real token's row's cosine >= `MIN_ROW_COSINE` (0.999: a row is one
  token, its rounding is not averaged away as a pooled mean's is; bfloat16 keeps 0.99978 at
  worst on all-MiniLM-L6-v2, onnxruntime float32 1 - 2e-12);
- sparse (SPLADE) weights [V]: (1) float32's `TOP_K` (32) largest indices of each text, all
  nonzero ones if fewer, are all among the candidate's `TOP_K` largest (`top_k_recall` >=
  `MIN_TOP_K_RECALL` = 1), except an index whose float32 weight lies within `SPARSE_TIE` (1e-4
  of the text's largest weight) of the largest weight float32 leaves out of its top-k: a near
  tie at the edge, which float32 itself orders by rounding; (2) every query/document pair's dot
  product within `MAX_DOT_DIFF` (1e-3) of float32's, in units of the two vectors' norms (a
  cosine's unit). A sparse answer is posted by its indices: a lost index drops the text from
  that term's postings, which no cosine sees (a tiny SPLADE in bfloat16 kept a cosine of 0.99999
  while 6 of the 16 texts lost 1 or 2 of their top-32 indices and a dot product moved by 1.6e-3;
  onnxruntime float32 lost none and moved them by 3e-8);
- scores: classifiers' softmax probabilities within `MAX_PROB_DIFF` (1e-3; bfloat16 keeps
  about 3e-4) and the same top label wherever float32's top two differ by more than `TIE`
  (nearer ties may flip); a one-logit model's (a reranker's) served score, its activation of
  the logit, within `MAX_SCORE_DIFF` (1e-3, of the largest score's magnitude where that
  exceeds 1: an identity activation's raw logits) and the texts' order by score kept wherever
  float32's scores differ by more than `TIE` (in those units).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MIN_COSINE = 0.9995
MIN_ROW_COSINE = 0.999
TOP_K = 32
MIN_TOP_K_RECALL = 1.0
SPARSE_TIE = 1e-4
MAX_DOT_DIFF = 1e-3
MAX_PROB_DIFF = 1e-3
MAX_SCORE_DIFF = 1e-3
TIE = 2e-3

# Each measured value's bound: (">=" or "<=", the bound); the booleans must hold.
BOUNDS: dict[str, tuple[str, float]] = {
    "min_cosine": (">=", MIN_COSINE),
    "min_row_cosine": (">=", MIN_ROW_COSINE),
    "top_k_recall": (">=", MIN_TOP_K_RECALL),
    "max_dot_diff": ("<=", MAX_DOT_DIFF),
    "max_prob_diff": ("<=", MAX_PROB_DIFF),
    "max_score_diff": ("<=", MAX_SCORE_DIFF),
}
KEPT = ("top_label_kept", "score_order_kept")


def checks_key() -> str:
    """The checks and their bounds as one string (part of the cached choice's key: a choice
    made under other checks is not reused)."""
    bounds = ",".join(f"{name}{op}{bound!r}" for name, (op, bound) in BOUNDS.items())
    return f"{bounds},{','.join(KEPT)},top_k={TOP_K},sparse_tie={SPARSE_TIE},tie={TIE}"


def bounds(names: tuple[str, ...]) -> dict[str, str]:
    """/info's `checks`: each check in `names` and its bound, e.g. {"min_cosine": ">= 0.9995"}."""
    out = {}
    for name in names:
        if name in BOUNDS:
            op, bound = BOUNDS[name]
            out[name] = f"{op} {bound:g}"
        elif name in KEPT:
            out[name] = "true"
    return out


@dataclass(frozen=True)
class Quality:
    """How close a candidate's answers are to torch float32's on the warm-up texts; a value is
    None where its output kind is not served (its check did not run)."""

    finite: bool
    min_cosine: float | None = None  # pooled vectors, lowest over the texts
    mean_cosine: float | None = None
    min_row_cosine: float | None = None  # token rows: lowest over the texts' real tokens
    top_k_recall: float | None = None  # sparse: lowest share of float32's top-k kept
    max_dot_diff: float | None = None  # sparse: pairs' dot products, in norm units
    max_prob_diff: float | None = None  # classifiers: largest softmax difference
    top_label_kept: bool | None = None  # classifiers: wherever float32's top two differ > TIE
    max_score_diff: float | None = None  # one logit: the served score's largest difference
    score_order_kept: bool | None = None  # one logit: order wherever float32's differ > TIE

    def checks(self) -> tuple[str, ...]:
        """The checks that ran (their measured values' names)."""
        return tuple(
            f.name
            for f in fields(self)
            if (f.name in BOUNDS or f.name in KEPT) and getattr(self, f.name) is not None
        )

    def failed(self) -> tuple[str, ...]:
        """The checks outside their bounds ("finite" first where a value is NaN or inf)."""
        if not self.finite:
            return ("finite",)
        out = []
        for name in self.checks():
            value = getattr(self, name)
            if name in KEPT:
                if value is False:
                    out.append(name)
                continue
            op, bound = BOUNDS[name]
            if not math.isfinite(value) or (value < bound if op == ">=" else value > bound):
                out.append(name)
        return tuple(out)

    def passes(self) -> bool:
        return not self.failed()

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"finite": self.finite, "passes": self.passes()}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "finite" or value is None:
                continue
            if isinstance(value, bool):
                out[f.name] = value
            else:
                out[f.name] = round(value, 6) if math.isfinite(value) else None
        if failed := self.failed():
            out["failed"] = list(failed)
        return out


def combined(*parts: Quality) -> Quality:
    """One `Quality` of several output kinds' checks (finite where all are)."""
    values: dict[str, Any] = {"finite": all(p.finite for p in parts)}
    for part in parts:
        for f in fields(part):
            if f.name != "finite" and getattr(part, f.name) is not None:
                values[f.name] = getattr(part, f.name)
    return Quality(**values)


def _finite(*tensors: torch.Tensor) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in tensors)


def vector_quality(reference: torch.Tensor, output: torch.Tensor) -> Quality:
    """Cosine of each row of `output` [B, D] to `reference`'s (lowest and mean over the rows);
    not finite when `output` holds NaN or inf."""
    import torch

    if not _finite(output):
        return Quality(finite=False)
    cos = torch.nn.functional.cosine_similarity(reference.double(), output.double(), dim=-1)
    return Quality(finite=True, min_cosine=float(cos.min()), mean_cosine=float(cos.mean()))


def rows_quality(reference: torch.Tensor, output: torch.Tensor, mask: torch.Tensor) -> Quality:
    """The lowest cosine of a real token's row of `output` [B, L, H] to `reference`'s, over
    the positions `mask` [B, L] marks (pad rows are not served: a packed backend leaves them
    zero, a padded one computes them)."""
    import torch

    real = mask.to(torch.bool)
    if not _finite(output[real]):
        return Quality(finite=False)
    cos = torch.nn.functional.cosine_similarity(
        reference[real].double(), output[real].double(), dim=-1
    )
    return Quality(finite=True, min_row_cosine=float(cos.min()))


def sparse_quality(reference: torch.Tensor, output: torch.Tensor, k: int = TOP_K) -> Quality:
    """SPLADE weights `output` [B, V] (>= 0) against float32's `reference` [B, V]: the lowest
    share over the texts of float32's top-k indices (k, or its nonzero count where fewer) kept
    among the candidate's top-k, near ties excused (module docstring), and the largest
    difference of the texts' pairwise dot products (every pair, each text with itself too)
    over the product of float32's two norms."""
    import torch

    if not _finite(output):
        return Quality(finite=False)
    ref, out = reference.double(), output.double()
    recall = 1.0
    for r, o in zip(ref, out, strict=True):
        n = min(k, int((r > 0).sum()))
        if n == 0:
            continue
        top_r, top_o = r.topk(n), o.topk(n).indices
        outside = float(r.topk(n + 1).values[-1]) if n < r.numel() else 0.0
        tie = SPARSE_TIE * float(top_r.values[0])
        lost = ~torch.isin(top_r.indices, top_o) & (top_r.values > outside + tie)
        recall = min(recall, 1.0 - int(lost.sum()) / n)
    norms = ref.norm(dim=-1).clamp_min(1e-12)
    scale = norms[:, None] * norms[None, :]
    dots = ((out @ out.T - ref @ ref.T).abs() / scale).max()
    return Quality(finite=True, top_k_recall=recall, max_dot_diff=float(dots))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": lambda x: x.sigmoid(),
    "identity": lambda x: x,
    "tanh": lambda x: x.tanh(),
}


def classifier_quality(
    reference: torch.Tensor, output: torch.Tensor, activation: str = "sigmoid"
) -> Quality:
    """Logits [B, labels]: softmax probabilities' largest difference to float32's, and whether
    each text keeps its top label wherever float32's two highest probabilities differ by
    more than `TIE`. One logit (a reranker): `score_quality` of `activation` (the model's,
    `ModelInfo.score_activation`; a class not in `ACTIVATIONS` is compared as identity)."""
    if not _finite(output):
        return Quality(finite=False)
    if output.shape[-1] == 1:
        return score_quality(reference, output, activation)
    p, q = reference.double().softmax(-1), output.double().softmax(-1)
    diff = float((p - q).abs().max())
    top2 = p.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > TIE
    kept = bool((p.argmax(-1) == q.argmax(-1))[clear].all())
    return Quality(finite=True, max_prob_diff=diff, top_label_kept=kept)


def score_quality(
    reference: torch.Tensor, output: torch.Tensor, activation: str = "sigmoid"
) -> Quality:
    """One logit per text [B, 1]: the served scores' (`activation` of the logit) largest
    difference to float32's, over max(1, float32's largest |score|), and whether every two
    texts whose float32 scores differ by more than `TIE` (same units) keep their order."""
    if not _finite(output):
        return Quality(finite=False)
    apply = ACTIVATIONS.get(activation, ACTIVATIONS["identity"])
    r, o = apply(reference.double().reshape(-1)), apply(output.double().reshape(-1))
    scale = max(1.0, float(r.abs().max()))
    diff = float((r - o).abs().max()) / scale
    gap_r = r[:, None] - r[None, :]
    clear = gap_r > TIE * scale
    kept = bool(((o[:, None] - o[None, :]) > 0)[clear].all())
    return Quality(finite=True, max_score_diff=diff, score_order_kept=kept)
