"""The causal-LM reranker engine: each (query, document) pair's score as `CrossEncoder.predict`
computes it before its activation, on left-padded batches. Inference thread only.

Per unit (`service.engine.llm_rerank.config` says what the folder asks):

1. the pair is rendered as sentence-transformers renders it: the tokenizer's pair encoding
   (the default prompt before the query), or, with a chat template, the messages
   `[system: prompt]`, `query: <query>`, `document: <document>` through
   `apply_chat_template` (a single text: one `user` message, or the tokenizer's single
   encoding);
2. over the model's limit it is refused (422), or cut when the unit asks for truncation: a
   chat render keeps its template's tail (sentence-transformers' `restore_suffix`: the tokens
   every render ends with are written back over the cut render's last ones, so the last
   position is the template's, as the model was trained to be read);
3. the batch is padded on the left, so every row ends in its last real token, and the model
   runs with `logits_to_keep=1` (the last position's logits only, [B, vocab]);
4. score = logit(true token) - logit(false token) (the true token's alone without one).

Answers: `logits` units get the score as a one-label logit (float32 [1]), which the rerank
routes put through the activation (sigmoid, as the folder's Sigmoid); `classify` units the
text-classification answer `[{label, score}]` (`function_to_apply`: sigmoid by default,
softmax over one label is 1, none the score). Options read (`PairParams`): `truncate`,
`direction`, `function_to_apply`, `count_tokens`, `pair_max_tokens` (the document cut to its
first N tokens first, as the encoder engine cuts it). Tokenize and decode are the encoder engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from service import metrics
from service.engine.forward.tokenizing import UnitTokenizer, pair_texts
from service.engine.jobs import NO_FORWARD, Counted, Op, Unit
from service.engine.llm_rerank.config import RerankerConfig
from service.engine.params import PairParams, narrow
from service.engine.types import ModelInfo, Prepared, prepare_each
from service.errors import InvalidInput

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: One turn of a chat, its content plain or structured ([{"type": "text", "text": ...}]).
Message: TypeAlias = dict[str, str | list[dict[str, str]]]
#: The tokenizer's size arguments (`truncation`, `max_length`).
Size: TypeAlias = str | int | bool | None


class CausalRerankEngine:
    """A decoder LLM scoring pairs by its "yes" and "no" logits."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        info: ModelInfo,
        config: RerankerConfig,
        device: torch.device,
    ) -> None:
        self.model, self.tok, self.info, self.config, self.device = (
            model,
            tokenizer,
            info,
            config,
            device,
        )
        self.tokenizer = UnitTokenizer(tokenizer, info, None)  # /tokenize and /decode
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._suffixes: dict[bool, list[int]] = {}

    # -- per unit ------------------------------------------------------------------------
    def prepare(self, unit: Unit) -> Prepared:
        """Render and tokenize one pair (or text); raises `InvalidInput` (422) for one over
        the model's limit without truncation."""
        if unit.op in NO_FORWARD:
            return self.tokenizer.prepare(unit)
        self.tok.truncation_side = unit.params.direction
        limit = self.info.max_input_tokens
        ids = self._encode(unit, truncate=False)
        if len(ids) > limit:
            if not unit.params.truncate:
                metrics.LONG_INPUTS.labels("refused").inc()
                raise InvalidInput(
                    f"input is {len(ids)} tokens; this model takes at most {limit} tokens "
                    "(shorten it, or ask for truncation: `truncate`, or LONG_INPUTS=truncate)"
                )
            metrics.LONG_INPUTS.labels("truncated").inc()
            ids = self._encode(unit, truncate=True)
        return Prepared(unit=unit, n_tokens=len(ids), payload=ids)

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        return prepare_each(self.prepare, units)

    def _encode(self, unit: Unit, *, truncate: bool) -> list[int]:
        assert unit.text is not None
        pair = None if unit.pair is None else pair_texts(self.tok, [unit])[0]
        size: dict[str, Size] = {"truncation": "longest_first", "max_length": None}
        if truncate:
            size["max_length"] = self.info.max_input_tokens
        else:
            size["truncation"] = False
        if self.config.chat is None:
            text = self.config.prompt + unit.text
            return list(self.tok(text, pair, verbose=False, **size)["input_ids"])
        ids = self._render(self._messages(unit.text, pair), **size)
        if truncate and self.tok.truncation_side == "right":
            suffix = self._suffix(pair is not None)
            keep = min(len(suffix), len(ids))
            if keep:
                ids[len(ids) - keep :] = suffix[len(suffix) - keep :]
        return ids

    def _messages(self, text: str, pair: str | None) -> list[Message]:
        """The conversation sentence-transformers renders for a pair (or one text)."""
        turns = [("user", text)] if pair is None else [("query", text), ("document", pair)]
        if self.config.prompt:
            turns.insert(0, ("system", self.config.prompt))
        if self.config.chat == "structured":
            return [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in turns]
        return [{"role": r, "content": c} for r, c in turns]

    def _render(self, messages: list[Message], **size: Size) -> list[int]:
        out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True, **size)
        return [int(i) for i in out["input_ids"]]

    def _suffix(self, paired: bool) -> list[int]:
        """The tokens every render ends with (sentence-transformers' `_chat_template_suffix_ids`:
        the longest common tail of two renders with different contents; none when they never
        differ)."""
        if paired not in self._suffixes:
            first, second = (
                self._render(self._messages(f, f if paired else None), truncation=False)
                for f in ("0", "1 2 3 4")
            )
            count = 0
            for a, b in zip(reversed(first), reversed(second), strict=False):
                if a != b:
                    break
                count += 1
            ok = 0 < count < min(len(first), len(second))
            self._suffixes[paired] = first[len(first) - count :] if ok else []
        return self._suffixes[paired]

    # -- per batch -----------------------------------------------------------------------
    def run(self, batch: list[Prepared]) -> list[object]:
        """One forward over the left-padded batch [B, L]; each unit's answer from its score."""
        import torch

        rows: list[list[int]] = [p.payload for p in batch]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), logits_to_keep=1
            )
        last = out.logits[:, -1].float().cpu()
        score = last[:, self.config.true_token_id]
        if self.config.false_token_id is not None:
            score = score - last[:, self.config.false_token_id]
        scores = score.numpy()
        return [self._answer(p, float(s)) for p, s in zip(batch, scores, strict=True)]

    def _answer(self, prepared: Prepared, score: float) -> object:
        unit = prepared.unit
        if unit.op is Op.CLASSIFY:
            function = narrow(unit.params, PairParams).function_to_apply or "sigmoid"
            value = {"sigmoid": 1 / (1 + np.exp(-score)), "softmax": 1.0, "none": score}[function]
            answer: list[dict[str, object]] | npt.NDArray[np.float32] = [
                {"label": self.info.labels[0], "score": float(value)}
            ]
        else:
            answer = np.array([score], dtype=np.float32)
        return Counted(answer, prepared.n_tokens) if unit.params.count_tokens else answer
