"""Tokenizing units for the encoder engine: texts (and pairs) to token ids with exact length
checks, client token ids used as given, and the answers that need no forward (TEI's /tokenize
and /decode). Inference thread only.

Options it reads (`service.engine.params.TextParams`, `TokenParams` for tokenize and decode):
`truncate`, `chunk`, `max_tokens`, `direction`, `strategy`, `pair_max_tokens`,
`prompt_name`, `add_special_tokens`, `skip_special_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from service import metrics
from service.engine.forward import late, windows
from service.engine.forward.prompts import prompt_length, st_text
from service.engine.jobs import Op, Unit
from service.engine.params import TokenParams, narrow
from service.engine.pooling.sentence import SentenceConfig
from service.engine.types import ModelInfo, Prepared, prepare_each
from service.errors import InvalidInput

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedTokenizerBase


@dataclass(eq=False, slots=True)
class Encoded:
    """One unit's token ids (and token type ids for pairs), ready to be padded into a batch."""

    ids: list[int]
    type_ids: list[int] | None
    prompt_tokens: int  # prompt tokens at the start, left out of pooling (include_prompt=False)
    # A late-chunked document's chunks as [start, end) token positions in `ids`, pooled each
    # alone (`service.engine.forward.late`); None: pooled as the model pools.
    spans: tuple[tuple[int, int], ...] | None = None


class UnitTokenizer:
    """The encoder engine's `prepare` and `prepare_many`, on the pipeline's tokenizer `tok`:
    each unit to its `Encoded` ids (or its answer, for tokenize and decode)."""

    def __init__(
        self, tok: PreTrainedTokenizerBase, info: ModelInfo, sentence: SentenceConfig | None
    ) -> None:
        self.tok = tok
        self.info = info
        self.sentence = sentence
        self.types = "token_type_ids" in tok.model_input_names
        self._prompt_tokens: dict[str, int] = {}
        self.chunker = windows.Chunker(tok, info.max_input_tokens, make=_windows_of(self.types))
        self.late = late.LateChunker(tok, info.max_input_tokens, make=_late_window_of(self.types))

    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize one unit and check its length exactly (no forward for tokenize/decode).

        Raises `InvalidInput` (422) for an input over `max_input_tokens` without truncation,
        token ids outside the vocabulary, or an empty input once tokenized to nothing.
        """
        if not _text_to_encode(unit):
            return self._prepare_other(unit)
        if _late(unit):
            return self.late.prepare(unit, self._text(unit))
        return self._encode_one(unit)

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        """`prepare` for each unit, in order; a unit's failure is its own entry (the exception
        `prepare` would raise), never its neighbours'.

        Texts that tokenize alike (same truncation, direction and strategy, all with or all
        without a pair) go through one tokenizer call: the tokenizers library encodes the list
        in Rust with the GIL released once, instead of once per text with the Python of a call
        around each. The ids are the same either way (`tests/engine/test_encoder.py`)."""
        out: dict[int, Prepared | Exception] = {}
        groups: dict[tuple[Hashable, ...], list[int]] = {}
        for k, unit in enumerate(units):
            if not _text_to_encode(unit) or _late(unit):
                out[k] = prepare_each(self.prepare, [unit])[0]
            else:
                groups.setdefault(_encode_key(unit), []).append(k)
        for members in groups.values():
            group = [units[k] for k in members]
            try:
                results = [
                    e if isinstance(e, Exception | Prepared) else _prepared(u, e)
                    for u, e in zip(group, self._encode_many(group), strict=True)
                ]
            except Exception:  # one text broke the call: each alone, so only it gets the error
                results = prepare_each(self._encode_one, group)
            out.update(zip(members, results, strict=True))
        return [out[k] for k in range(len(units))]

    def _encode_one(self, unit: Unit) -> Prepared:
        result = self._encode_many([unit])[0]
        if isinstance(result, Exception):
            raise result
        return result if isinstance(result, Prepared) else _prepared(unit, result)

    def _prepare_other(self, unit: Unit) -> Prepared:
        if unit.op is Op.DECODE:
            skip = narrow(unit.params, TokenParams).skip_special_tokens
            return Prepared(unit=unit, n_tokens=0, answer=self._decode(unit, skip))
        if unit.op is Op.TOKENIZE:
            return Prepared(unit=unit, n_tokens=0, answer=self._tokens(unit))
        return _prepared(unit, self._ids(unit))

    def _text(self, unit: Unit) -> str:
        assert unit.text is not None
        prompt = self._prompt(unit)
        if self.sentence is not None:
            return st_text(unit.text, self.sentence, prompt)
        return prompt + unit.text if prompt else unit.text

    def _prompt(self, unit: Unit) -> str | None:
        name = unit.params.prompt_name
        return None if name is None else self.info.prompts[name] if name else ""

    def _encode_many(self, units: Sequence[Unit]) -> list[Encoded | Prepared | Exception]:
        """One tokenizer call for `units` (one `_encode_key`); an over-length unit's entry is
        its 422 (`InvalidInput`), or its windows (`chunk`). Raises what the tokenizer raises."""
        first = units[0]
        limit = _limit(first, self.info.max_input_tokens, self.tok.num_special_tokens_to_add())
        truncate = first.params.truncate
        self.tok.truncation_side = first.params.direction
        strategy = first.params.strategy if truncate else False
        enc = self.tok(
            [self._text(u) for u in units],
            None if first.pair is None else pair_texts(self.tok, units),
            truncation=strategy,
            max_length=limit if truncate else None,
            return_attention_mask=False,
            return_token_type_ids=self.types,
            verbose=False,  # over-length inputs get our 422, not the tokenizer's warning
        )
        out: list[Encoded | Prepared | Exception] = []
        for i, unit in enumerate(units):
            ids = list(enc["input_ids"][i])
            if len(ids) > limit:
                out.append(self._over_limit(unit, len(ids), limit))
                continue
            if truncate and _truncated(enc, i):
                metrics.LONG_INPUTS.labels("truncated").inc()
            types = list(enc["token_type_ids"][i]) if self.types else None
            out.append(Encoded(ids=ids, type_ids=types, prompt_tokens=self._prompt_length(unit)))
        return out

    def _over_limit(self, unit: Unit, n: int, limit: int) -> Prepared | InvalidInput:
        """A text of `n` tokens over its `limit`, without truncation: its windows when the unit
        asks for `chunk` (an `embed` text alone, under the model's own limit: pooled
        embeddings average), else its 422."""
        chunkable = unit.op is Op.EMBED and unit.pair is None
        if unit.params.chunk and chunkable and unit.params.max_tokens is None:
            metrics.LONG_INPUTS.labels("chunked").inc()
            return self.chunker.prepare(unit, self._text(unit), self._prompt_length(unit))
        metrics.LONG_INPUTS.labels("refused").inc()
        return _too_long(n, limit, unit)

    def _ids(self, unit: Unit) -> Encoded:
        """Token ids sent by the client, used as given (no special tokens added; TEI does the
        same): truncated or refused like text."""
        assert unit.ids is not None
        ids = list(unit.ids)
        _check_vocabulary(ids, self.info.vocab_size)
        limit = _limit(unit, self.info.max_input_tokens, 0)  # ids: no special tokens added
        if len(ids) > limit:
            if not unit.params.truncate:
                metrics.LONG_INPUTS.labels("refused").inc()
                raise InvalidInput(
                    f"input is {len(ids)} tokens; this model takes at most {limit} tokens"
                )
            metrics.LONG_INPUTS.labels("truncated").inc()
            ids = ids[-limit:] if unit.params.direction == "left" else ids[:limit]
        return Encoded(ids=ids, type_ids=[0] * len(ids) if self.types else None, prompt_tokens=0)

    def _prompt_length(self, unit: Unit) -> int:
        name = unit.params.prompt_name
        if not name or self.sentence is None or self.sentence.include_prompt:
            return 0
        if name not in self._prompt_tokens:
            self._prompt_tokens[name] = prompt_length(self.tok, self.info.prompts[name])
        return self._prompt_tokens[name]

    def _tokens(self, unit: Unit) -> list[dict[str, int | str | bool | None]]:
        """TEI's /tokenize answer for one input (its `into_tokens`): each token's id, its text,
        whether the tokenizer added it (the special-tokens mask: [CLS], [SEP]; an [UNK] from the
        text is not special) and its span as UTF-8 byte offsets into the input with its prompt
        (TEI reports the Rust tokenizer's byte offsets); a special token has its own text and
        no span."""
        text = self._text(unit)
        enc = self.tok(
            text,
            add_special_tokens=narrow(unit.params, TokenParams).add_special_tokens,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        ids = enc["input_ids"]
        pieces = self.tok.convert_ids_to_tokens(ids)
        to_byte = _byte_offsets(text)
        out = []
        for token_id, piece, (start, stop), special in zip(
            ids, pieces, enc["offset_mapping"], enc["special_tokens_mask"], strict=True
        ):
            out.append(
                {
                    "id": int(token_id),
                    "text": piece if special else text[start:stop],
                    "special": bool(special),
                    "start": None if special else to_byte(start),
                    "stop": None if special else to_byte(stop),
                }
            )
        return out

    def _decode(self, unit: Unit, skip_special_tokens: bool) -> str:
        assert unit.ids is not None
        _check_vocabulary(unit.ids, self.info.vocab_size)
        return str(self.tok.decode(list(unit.ids), skip_special_tokens=skip_special_tokens))


def _text_to_encode(unit: Unit) -> bool:
    """A text for the forward (not token ids, not /tokenize or /decode)."""
    return unit.ids is None and unit.op is not Op.DECODE and unit.op is not Op.TOKENIZE


def _encode_key(unit: Unit) -> tuple[Hashable, ...]:
    """What must be alike for units to share one tokenizer call."""
    p = unit.params
    return (p.truncate, p.direction, p.strategy, p.max_tokens, p.pair_max_tokens, unit.pair is None)


def _windows_of(types: bool) -> Callable[[list[int], int], Encoded]:
    """A window's `Encoded` from its ids and its prompt tokens (token types: zeros)."""
    return lambda ids, prompt: Encoded(
        ids=ids, type_ids=[0] * len(ids) if types else None, prompt_tokens=prompt
    )


def _late(unit: Unit) -> bool:
    """A late-chunked document (`EmbedParams.late_chunks`)."""
    return getattr(unit.params, "late_chunks", None) is not None


def _late_window_of(types: bool) -> late.Make:
    """A late-chunked window's `Encoded` from its ids and its chunks' token spans."""
    return lambda ids, spans: Encoded(
        ids=ids, type_ids=[0] * len(ids) if types else None, prompt_tokens=0, spans=spans
    )


def _truncated(enc: BatchEncoding, i: int) -> bool:
    """The tokenizer cut text `i` of the call's answer `enc` (its overflow is not empty)."""
    encodings = getattr(enc, "encodings", None)
    return bool(encodings and encodings[i].overflowing)


def _limit(unit: Unit, model_limit: int, specials: int) -> int:
    """The unit's token limit: the model's, or the unit's `max_tokens` (the input's own tokens,
    the prompt's included) plus the `specials` the tokenizer adds, where that is lower."""
    asked = unit.params.max_tokens
    return model_limit if asked is None else min(model_limit, asked + specials)


def _too_long(n: int, limit: int, unit: Unit) -> InvalidInput:
    if unit.params.max_tokens is not None:
        return InvalidInput(
            f"input is {n} tokens (special tokens included); the limit is {limit}: "
            f"max_tokens {unit.params.max_tokens} or this model's, whichever is lower "
            "(shorten it, or ask for truncation)"
        )
    if unit.params.chunk:
        return InvalidInput(
            f"input is {n} tokens; this model takes at most {limit} tokens (LONG_INPUTS=chunk "
            "makes windows of pooled embeddings only: ask for truncation with `truncate` or "
            "`parameters.truncation` where the route takes them)"
        )
    return InvalidInput(
        f"input is {n} tokens; this model takes at most {limit} tokens (shorten it, or ask for "
        "truncation: `truncate` or `parameters.truncation` where the route takes them, or "
        "LONG_INPUTS=truncate or chunk on the server)"
    )


def pair_texts(tok: PreTrainedTokenizerBase, units: Sequence[Unit]) -> list[str]:
    """Each unit's pair text; with `pair_max_tokens` N, cut where its N-th token ends (its
    first N tokens, special tokens not counted), so that the pair then holds at most N tokens
    of it (Cohere's `max_tokens_per_doc`). A tokenizer without offsets (not a fast one)
    writes its first N tokens back as text instead."""
    pairs = [str(u.pair) for u in units]
    n = units[0].params.pair_max_tokens
    if n is None:
        return pairs
    if not getattr(tok, "is_fast", False):
        return [tok.convert_tokens_to_string(tok.tokenize(text)[:n]) for text in pairs]
    enc = tok(
        pairs,
        add_special_tokens=False,
        truncation=True,
        max_length=n,
        return_offsets_mapping=True,
        verbose=False,
    )
    return [
        text[: spans[-1][1]] if len(spans) >= n else text
        for text, spans in zip(pairs, enc["offset_mapping"], strict=True)
    ]


def _prepared(unit: Unit, encoded: Encoded) -> Prepared:
    return Prepared(unit=unit, n_tokens=len(encoded.ids), payload=encoded)


def _byte_offsets(text: str) -> Callable[[int], int]:
    """A function from a character offset in `text` to its UTF-8 byte offset."""
    if text.isascii():
        return int
    starts = np.cumsum([0, *(len(c.encode("utf-8", "surrogatepass")) for c in text)])
    return lambda i: int(starts[i])


def _check_vocabulary(ids: Sequence[int], vocab: int) -> None:
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise InvalidInput(f"token id {bad} is outside this model's vocabulary (0..{vocab - 1})")
