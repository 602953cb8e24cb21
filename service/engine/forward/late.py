"""Late chunking (Günther et al., 2024, "Late Chunking: Contextual Chunk Embeddings Using
Long-Context Embedding Models"): one document, sent as its chunks in order, is encoded once,
and each chunk's vector is pooled from the token embeddings of the whole document, so a chunk
keeps its context. Inference thread only.

The unit's text is the chunks joined with single spaces; `late_chunks` (its params) holds each
chunk's character span in it. The rule:

1. the text sentence-transformers would tokenize (the prompt, if any, then the joined text) is
   tokenized without special tokens, with character offsets; chunk i's tokens are those whose
   span overlaps chunk i's (a token of no characters never counts; the prompt's tokens are in
   no chunk). A chunk with no token is a 422 naming it (`at="[i]"`: `input[3]`);
2. the document fits one window (the model's `max_input_tokens`, special tokens included): it
   is one input, wrapped in the tokenizer's special tokens like any text;
3. else it is cut into windows, after the paper's "long late chunking" (macro chunks that
   overlap, so that each starts with context from the text before it; jina-ai/late-chunking's
   `_embed_with_overlap`, 256 tokens of overlap). Each window is `size` content tokens (the
   window less the special tokens) and starts `overlap` tokens (`types.late_limits`) before
   the first chunk not yet pooled, or later where that chunk would not fit whole otherwise
   (the first window starts at the document's start); it pools every chunk not yet pooled
   that it holds whole. So each chunk is pooled from one window that holds it whole, with at
   least `overlap` tokens of context before it where the document has them, and whatever
   follows it in that window. A chunk longer than `size` tokens (no window holds it) is a 422
   naming it, as is a document over `types.late_limits`' `max_tokens`;
4. a chunk's vector is the mean of its tokens' rows of the last hidden state (span pooling,
   whatever the folder's Pooling mode), then the folder's Dense modules, `dimensions` and
   normalization as for any embedding (`service.engine.pooling.outputs.late_rows`).

A one-window document is one input of the batcher; a longer one is an input per window
(`Prepared.parts`, like LONG_INPUTS=chunk's windows), each answering its chunks' vectors
before normalization, merged in order (`merge`). Its `Counted` tokens are the joined text's
(special tokens included, once), for usage counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from service.engine.forward.windows import Template, template, window_parts
from service.engine.jobs import Counted, Unit
from service.engine.params import EmbedParams, narrow
from service.engine.types import Prepared, late_limits
from service.errors import InvalidInput

#: A window's payload from its ids (special tokens included) and its chunks' token spans in
#: them ([start, end) positions): the encoder's `Encoded`.
Make = Callable[[list[int], tuple[tuple[int, int], ...]], Any]


def token_spans(
    offsets: Sequence[tuple[int, int]], chunks: Sequence[tuple[int, int]], shift: int
) -> list[tuple[int, int]]:
    """Each chunk's tokens as a [start, end) range of token positions: the tokens whose
    character span (`offsets`, in the tokenized text) overlaps the chunk's (`chunks`, in the
    joined text, which starts at character `shift` of the tokenized one). Raises
    `InvalidInput` (at the chunk's index) for a chunk that maps to no token."""
    starts = np.array([s for s, _ in offsets], dtype=np.int64)
    ends = np.array([e for _, e in offsets], dtype=np.int64)
    real = ends > starts
    out = []
    for i, (a, b) in enumerate(chunks):
        hit = np.flatnonzero(real & (starts < b + shift) & (ends > a + shift))
        if hit.size == 0:
            raise InvalidInput("this chunk maps to no token of the model", at=f"[{i}]")
        out.append((int(hit[0]), int(hit[-1]) + 1))
    return out


def plan(
    spans: Sequence[tuple[int, int]], n: int, size: int, overlap: int
) -> list[tuple[int, list[int]]]:
    """The windows of a document of `n` content tokens whose chunks are `spans`: (the window's
    first token, the chunks it pools), each window `size` tokens (less at the end), by the
    module's rule 3. Raises `InvalidInput` (at the chunk's index) for a chunk over `size`."""
    if n <= size:
        return [(0, list(range(len(spans))))]
    windows: list[tuple[int, list[int]]] = []
    i = 0
    while i < len(spans):
        first, last = spans[i]
        if last - first > size:
            raise InvalidInput(
                f"this chunk is {last - first} tokens; late chunking pools a chunk from one "
                f"window of {size} tokens (split it)",
                at=f"[{i}]",
            )
        start = max(0, first - overlap, last - size)
        held = []
        while i < len(spans) and spans[i][1] <= start + size:
            held.append(i)
            i += 1
        windows.append((start, held))
    return windows


class LateChunker:
    """One tokenizer's late-chunked documents, for a model of `limit` tokens a window;
    `make` builds a window's payload."""

    def __init__(self, tok: Any, limit: int, make: Make) -> None:
        self.tok, self.limit, self.make = tok, limit, make
        self._template: Template | None = None

    def prepare(self, unit: Unit, text: str) -> Prepared:
        """`unit` (its joined text `unit.text`, tokenized as `text`: the prompt, then the
        joined text) as one input or its windows. Raises `InvalidInput` as the module says."""
        if self._template is None:
            self._template = template(self.tok)
        tpl = self._template
        params = narrow(unit.params, EmbedParams)
        chunks = params.late_chunks
        assert chunks is not None
        assert unit.text is not None and text.endswith(unit.text)
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        content = list(enc["input_ids"])
        spans = token_spans(enc["offset_mapping"], chunks, len(text) - len(unit.text))
        limits = late_limits(self.limit)
        total = len(content) + tpl.size
        if total > limits["max_tokens"]:
            raise InvalidInput(
                f"the joined chunks are {total} tokens; late chunking takes at most "
                f"{limits['max_tokens']} (/info's late_chunking); send fewer chunks"
            )
        size = self.limit - tpl.size
        windows = plan(spans, len(content), size, limits["overlap_tokens"])
        payloads = []
        for start, held in windows:
            ids = [*tpl.prefix, *content[start : start + size], *tpl.suffix]
            at = len(tpl.prefix) - start
            payloads.append(
                self.make(ids, tuple((spans[k][0] + at, spans[k][1] + at) for k in held))
            )
        if len(payloads) == 1:
            return Prepared(unit=unit, n_tokens=len(payloads[0].ids), payload=payloads[0])
        parts = window_parts(unit, payloads)
        return Prepared(
            unit=unit,
            n_tokens=sum(p.n_tokens for p in parts),
            parts=parts,
            merge=partial(merge, tokens=total, params=params),
        )


def merge(answers: list[Any], *, tokens: int, params: EmbedParams) -> Any:
    """The document's chunk vectors [chunks, D] from its windows' (each [held, D], in window
    order), cut to `dimensions` and normalized as `params` say; `Counted` with the joined
    text's `tokens` when `count_tokens` asks."""
    import torch

    from service.engine.pooling.pool import finish

    stacked = torch.from_numpy(np.concatenate([a for a in answers if len(a)], axis=0))
    vectors = finish(
        stacked,
        normalize=params.normalize,
        dimensions=params.dimensions,
    ).numpy()
    return Counted(vectors, tokens) if params.count_tokens else vectors
