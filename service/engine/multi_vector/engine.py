"""The multi-vector engine: per input, the token vectors `MultiVectorEncoder.encode_query` or
`encode_document` answers, computed on padded batches of units. Inference thread only.

What sentence-transformers does for a text of input type `task` ("query" or "document"),
and this engine after it (`MultiVectorConfig` holds the folder's options):

1. the task's prompt goes before the text (`prompts["query"]` / `prompts["document"]`);
2. it is tokenized with special tokens, cut at the task's length (`query_length` /
   `document_length`, else the model's limit); over it without truncation: 422;
3. a query shorter than `query_expansion.length` is filled up to it with the expansion token
   (attended to by the encoder only with `attend`; scored either way);
4. the encoder's token rows go through the Dense modules and the Normalize, token by token;
5. the answer keeps the rows MultiVectorMask keeps: real tokens and expansion positions, less
   the skiplist's tokens on the tasks it names (documents by default), and for documents only
   the `keep_only_token_ids`; without a MultiVectorMask, the rows the encoder attended to;
6. token pooling (`token_pooling.pool`): the folder's HierarchicalTokenPooling on the tasks it
   names, where it stands in the modules (a Normalize after it applies after it), or the
   request's `pool_factor` (its factor replacing the folder's; without a folder module,
   `encode_document(token_pooling=HierarchicalTokenPooling(pool_factor, num_protected_tokens))`:
   after the whole pipeline, the pooled rows normalized, queries left as they are).

Options read (`MultiVectorParams`): `input_type`, `truncate`, `chunk` (LONG_INPUTS=chunk,
which multi-vector answers do not make: a long input is a 422 saying so), `max_tokens_per_doc`
(the text cut to its first N tokens, prompt and special tokens not counted, before it is
encoded), `pool_factor` and `protected_tokens` (step 6), `count_tokens` (answer
`jobs.Counted`). Tokenize and decode are the encoder engine's (`UnitTokenizer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from service.backends import Backend
from service.engine.folders import UnsupportedModel
from service.engine.forward.tokenizing import UnitTokenizer
from service.engine.jobs import NO_FORWARD, Counted, Unit
from service.engine.multi_vector.config import MultiVectorConfig, TokenPooling
from service.engine.multi_vector.token_pooling import pool
from service.engine.params import MultiVectorParams, narrow
from service.engine.pooling import heads
from service.engine.types import ModelInfo, Prepared, prepare_each
from service.errors import InvalidInput

TASKS = ("query", "document")


@dataclass(eq=False, slots=True)
class Tokens:
    """One unit's ids, what the encoder attends to (0/1) and which rows its answer keeps."""

    ids: list[int]
    attention: list[int]
    keep: list[bool]


class MultiVectorEngine:
    """A multi-vector model: the pipeline's encoder and tokenizer, the folder's heads."""

    def __init__(
        self, pipe: Any, info: ModelInfo, config: MultiVectorConfig, backend: Backend
    ) -> None:
        self.pipe, self.info, self.config, self.backend = pipe, info, config, backend
        tok = pipe.tokenizer
        self.tok = tok
        self.tokenizer = UnitTokenizer(tok, info, None)  # /tokenize and /decode
        self.left = tok.padding_side == "left"
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        self.types = "token_type_ids" in tok.model_input_names
        folder = Path(config.folder)
        self.heads = tuple(heads.load_dense(folder, spec, pipe.device) for spec in config.dense)
        self.skip = frozenset(_skiplist(tok, config.mask.skiplist_words if config.mask else ()))
        self.expansion_id = self._expansion_id()

    def _expansion_id(self) -> int:
        expansion = self.config.expansion
        if expansion is None:
            return self.pad_id
        if self.left:
            raise UnsupportedModel(
                "query_expansion with a left-padding tokenizer is not supported (the filled "
                "positions would move with each batch's padding)"
            )
        if expansion.token is not None:
            found = self.tok.convert_tokens_to_ids(expansion.token)
            if found is None or found == self.tok.unk_token_id:
                raise UnsupportedModel(
                    f"query_expansion token {expansion.token!r} is not in the vocabulary"
                )
            return int(found)
        for candidate in (self.tok.mask_token_id, self.tok.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return self.pad_id

    # -- per unit ------------------------------------------------------------------------
    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize one unit as its input type says; raises `InvalidInput` (422) for an input
        over the task's length without truncation."""
        if unit.op in NO_FORWARD:
            return self.tokenizer.prepare(unit)
        task = narrow(unit.params, MultiVectorParams).input_type
        assert unit.text is not None and task in TASKS
        text = _cut(self.tok, unit.text, narrow(unit.params, MultiVectorParams).max_tokens_per_doc)
        ids = self._ids(self.config.prompts.get(task, "") + text, task, unit)
        tokens = self._tokens(ids, task)
        return Prepared(unit=unit, n_tokens=len(tokens.ids), payload=tokens)

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        return prepare_each(self.prepare, units)

    def limit(self, task: str) -> int:
        """The most tokens an input of `task` may have (special tokens included)."""
        c, expansion = self.config, self.config.expansion
        length = c.query_length if task == "query" else c.document_length
        if task == "query" and expansion is not None:
            if expansion.strategy == "fixed":
                return expansion.length
            return max(length, expansion.length) if length else self.info.max_input_tokens
        return length or self.info.max_input_tokens

    def _ids(self, text: str, task: str, unit: Unit) -> list[int]:
        limit = self.limit(task)
        truncate = unit.params.truncate
        enc = self.tok(
            text,
            truncation="longest_first" if truncate else False,
            max_length=limit if truncate else None,
            verbose=False,
        )
        ids = [int(i) for i in enc["input_ids"]]
        if len(ids) > limit:
            why = (
                " (LONG_INPUTS=chunk makes windows of pooled embeddings only: ask for truncation "
                "with `truncate`)"
                if unit.params.chunk
                else " (shorten it, or ask for truncation: `truncate`, or LONG_INPUTS=truncate)"
            )
            raise InvalidInput(
                f"input is {len(ids)} tokens; this model takes at most {limit} tokens as a "
                f"{task}{why}"
            )
        return ids

    def _tokens(self, ids: list[int], task: str) -> Tokens:
        """The unit's ids with any query expansion, and the rows its answer keeps."""
        attention = [1] * len(ids)
        expansion = self.config.expansion if task == "query" else None
        if expansion is not None and len(ids) < expansion.length:
            filled = expansion.length - len(ids)
            ids = ids + [self.expansion_id] * filled
            attention = attention + [int(expansion.attend)] * filled
        mask = self.config.mask
        if mask is None:  # the rows the encoder attended to
            return Tokens(ids, attention, [a == 1 for a in attention])
        keep = [True] * len(ids)
        if task in mask.skiplist_tasks and self.skip:
            keep = [k and i not in self.skip for k, i in zip(keep, ids, strict=True)]
        if task != "query" and mask.keep_only_token_ids:
            allowed = set(mask.keep_only_token_ids)
            keep = [k and i in allowed for k, i in zip(keep, ids, strict=True)]
        return Tokens(ids, attention, keep)

    # -- per batch -----------------------------------------------------------------------
    def run(self, batch: list[Prepared]) -> list[Any]:
        """One forward over the padded batch [B, L]; each unit's kept rows [n, D] float32 (the
        encoder's rows [B, L, H] through the Dense modules and Normalize), token-pooled where
        the folder or the unit asks."""
        import torch
        import torch.nn.functional as F

        tokens: list[Tokens] = [p.payload for p in batch]
        inputs, keep = self._pad(tokens)
        hidden = self.backend.forward(inputs)  # float32 on the CPU
        rows = heads.apply_dense(hidden, self.heads)
        if self.config.normalize:
            rows = F.normalize(rows, p=2, dim=-1)
        keep_mask = torch.from_numpy(keep).to(rows.device)
        out: list[Any] = []
        for i, prepared in enumerate(batch):
            answer = rows[i][keep_mask[i]].cpu().numpy()
            pooling = self.pooling(prepared.unit)
            if pooling is not None:
                answer = pool(answer, pooling)
            if self.config.normalize_pooled:
                answer = _normalized(answer)
            count = prepared.unit.params.count_tokens
            out.append(Counted(answer, prepared.n_tokens) if count else answer)
        return out

    def pooling(self, unit: Unit) -> TokenPooling | None:
        """The token pooling a unit's answer gets (None: none): the request's `pool_factor`
        and `protected_tokens` over the folder's module (or over sentence-transformers'
        per-call defaults: documents, normalized), else the folder's module; either only on
        the tasks it names."""
        params, pooling = narrow(unit.params, MultiVectorParams), self.config.pooling
        factor, protected = params.pool_factor, params.protected_tokens
        if factor is not None or protected is not None:
            asked = pooling or TokenPooling()
            if factor is not None:
                asked = replace(asked, pool_factor=factor, max_tokens=None, distance_threshold=None)
            if protected is not None:
                asked = replace(asked, protected_tokens=protected)
            pooling = asked
        task = params.input_type
        return pooling if pooling is not None and task in pooling.tasks else None

    def _pad(self, tokens: list[Tokens]) -> tuple[dict[str, Any], np.ndarray]:
        import torch

        width = max(len(t.ids) for t in tokens)
        ids = np.full((len(tokens), width), self.pad_id, dtype=np.int64)
        attention = np.zeros((len(tokens), width), dtype=np.int64)
        keep = np.zeros((len(tokens), width), dtype=bool)
        for i, t in enumerate(tokens):
            cols = slice(width - len(t.ids), width) if self.left else slice(0, len(t.ids))
            ids[i, cols], attention[i, cols], keep[i, cols] = t.ids, t.attention, t.keep
        inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(attention)}
        if self.types:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return inputs, keep


def _normalized(rows: np.ndarray) -> np.ndarray:
    norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), np.float32(1e-12))
    out: np.ndarray = (rows / norms).astype(np.float32, copy=False)
    return out


def _cut(tok: Any, text: str, n: int | None) -> str:
    """`text` cut where its N-th token ends (special tokens not counted), as the encoder engine
    cuts a reranked document (`forward.tokenizing.pair_texts`); a tokenizer without offsets
    writes its first N tokens back as text."""
    if n is None:
        return text
    if not getattr(tok, "is_fast", False):
        return str(tok.convert_tokens_to_string(tok.tokenize(text)[:n]))
    spans = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = spans["offset_mapping"]
    return text[: offsets[n - 1][1]] if len(offsets) > n else text


def _skiplist(tok: Any, words: Sequence[str]) -> list[int]:
    """The skiplist's token ids, as MultiVectorMask resolves them: each word's id, words the
    tokenizer maps to [UNK] left out (unless the word is [UNK] itself)."""
    out = []
    for word in words:
        token_id = tok.convert_tokens_to_ids(word)
        if token_id is None or (token_id == tok.unk_token_id and word != tok.unk_token):
            continue
        out.append(int(token_id))
    return out
