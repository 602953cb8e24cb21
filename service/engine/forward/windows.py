"""Long inputs in windows (LONG_INPUTS=chunk): one input over the model's limit embedded as
the weighted mean of its windows' embeddings. Inference thread only.

The rule, after vLLM's chunked processing of pooling models (its `enable_chunked_processing`:
each chunk pooled alone, the pooled vectors averaged weighted by their token counts):

1. the input's tokens without special tokens (prompt included: the text sentence-transformers
   would tokenize) are cut into consecutive windows of `limit - specials` tokens, `specials`
   being the tokens the tokenizer adds around one text ([CLS] and [SEP] for BERT);
2. each window gets those special tokens back and is pooled as the model pools (Pooling, then
   its Dense modules), unnormalized;
3. the pooled vectors are averaged, each weighted by its window's length, special tokens
   included; then `dimensions` cuts and the model's normalization applies, as for any input.

Each window is a unit of its own for the batcher (`Prepared.parts`; its answer is the pooled
vector): windows batch with any other input, count in the queue and cost one input each
(`service.engine.batching.parts`), and `merge` turns their answers into the input's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from service.engine.jobs import Counted, Op, Unit
from service.engine.params import EmbedParams, narrow
from service.engine.types import Prepared

#: A window's own answer, neither cut nor normalized: its pooled vector (after any Dense
#: modules), or a late-chunked window's chunk vectors; the input's parameters apply once, to
#: the mean or to all of a document's chunks (`merge`, `service.engine.forward.late.merge`).
WINDOW_PARAMS = EmbedParams(normalize=False)


@dataclass(frozen=True)
class Template:
    """The special tokens a tokenizer adds around one text: `prefix + text + suffix`."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.prefix) + len(self.suffix)


def template(tok: Any) -> Template:
    """Where `tok` puts its special tokens for one text, read from one probe text tokenized
    with and without them (the probe's own tokens sit between the two parts)."""
    bare = list(tok("a", add_special_tokens=False)["input_ids"])
    full = list(tok("a")["input_ids"])
    at = next(
        (i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None
    )
    if at is None:  # a post-processor that rewrites the text's own tokens: no template
        raise ValueError("the tokenizer's special tokens do not wrap a text: cannot chunk")
    return Template(prefix=tuple(full[:at]), suffix=tuple(full[at + len(bare) :]))


def split(content: Sequence[int], limit: int, tpl: Template) -> list[list[int]]:
    """`content` (token ids without special tokens) in consecutive windows of
    `limit - tpl.size` tokens, each wrapped in the template's special tokens."""
    size = limit - tpl.size
    if size < 1:
        raise ValueError(f"a limit of {limit} tokens leaves no room beside {tpl.size} specials")
    return [
        [*tpl.prefix, *content[start : start + size], *tpl.suffix]
        for start in range(0, len(content), size)
    ]


class Chunker:
    """One tokenizer's long texts in windows of `limit` tokens; `make(ids, prompt_tokens)`
    builds a window's payload for the engine (the encoder's `Encoded`)."""

    def __init__(self, tok: Any, limit: int, make: Callable[[list[int], int], Any]) -> None:
        self.tok, self.limit, self.make = tok, limit, make
        self._template: Template | None = None

    def prepare(self, unit: Unit, text: str, prompt_tokens: int) -> Prepared:
        """`unit` (whose string to tokenize is `text`, its first `prompt_tokens` tokens the
        prompt's) as its windows; the prompt is in the first window only."""
        if self._template is None:
            self._template = template(self.tok)
        content = self.tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        windows = split(content, self.limit, self._template)
        payloads = [
            self.make(ids, min(prompt_tokens, len(ids)) if k == 0 else 0)
            for k, ids in enumerate(windows)
        ]
        return chunked(unit, payloads)


def window_parts(unit: Unit, windows: Sequence[Any]) -> tuple[Prepared, ...]:
    """`unit`'s windows as parts: one `embed` unit each (`WINDOW_PARAMS`: neither cut nor
    normalized), `windows` their payloads, each with its `ids`."""
    return tuple(
        Prepared(
            unit=Unit(op=Op.EMBED, text=unit.text, params=WINDOW_PARAMS),
            n_tokens=len(w.ids),
            payload=w,
        )
        for w in windows
    )


def chunked(unit: Unit, windows: Sequence[Any]) -> Prepared:
    """`unit` as its windows (`Prepared.parts`, one `embed` unit each; `windows`: their
    payloads, the encoder's `Encoded`, each with its `ids`) and the `merge` of their answers
    into its own."""
    parts = window_parts(unit, windows)
    weights = [len(w.ids) for w in windows]
    return Prepared(
        unit=unit,
        n_tokens=sum(weights),
        parts=parts,
        merge=partial(merge, weights=weights, params=narrow(unit.params, EmbedParams)),
    )


def merge(answers: list[Any], *, weights: Sequence[int], params: EmbedParams) -> Any:
    """The input's embedding from its windows' pooled vectors [D] (in window order): their
    mean weighted by `weights` (tokens per window), cut to `dimensions` and normalized as
    `params` say; `Counted` with every window's tokens when `count_tokens` asks."""
    import torch

    from service.engine.pooling.pool import finish

    w = np.asarray(weights, dtype=np.float64)
    mean = (np.stack(answers).astype(np.float64) * w[:, None]).sum(axis=0) / w.sum()
    vector = finish(
        torch.from_numpy(mean.astype(np.float32))[None],
        normalize=params.normalize,
        dimensions=params.dimensions,
    )[0].numpy()
    return Counted(vector, int(w.sum())) if params.count_tokens else vector
