"""The static embedding engine: each text's vector is the mean of its tokens' rows, as
sentence-transformers' `StaticEmbedding` computes it. Inference thread only.

Per unit: `prompt + text` tokenized by the module's own `tokenizers.Tokenizer` without special
tokens (`StaticEmbedding.preprocess`), or the client's token ids as given; a `max_tokens` limit
(Cohere's) cuts the ids or refuses them (422) as `truncate` says. The model has no limit of its
own (`max_seq_length` is infinite): a request's size is bounded by MAX_BODY_BYTES. Per batch:
one `embedding_bag(mode="mean")` over the batch's ids laid end to end (no padding: a batch costs
its real tokens), then each vector cut to `dimensions` and normalized as its unit asks
(`EmbedParams`). An input of no tokens is the zero vector, as `encode` answers it.

Served ops: `embed`, `tokenize`, `decode`. Token rows (`/embed_all`) are not: a static model has
no contextual token embeddings (`encode(output_value="token_embeddings")` has none either), and
late chunking is refused (422), its answer being each chunk's own vector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from service import metrics
from service.engine.forward.tokenizing import UnitTokenizer
from service.engine.jobs import NO_FORWARD, Counted, Ranged, Unit
from service.engine.params import EmbedParams, narrow
from service.engine.types import ModelInfo, Prepared
from service.errors import InvalidInput

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

    from service.backends import Backend
    from service.engine.pooling.calibration import Calibration


class EmbeddingBag:
    """The mean of each input's token rows (`torch.nn.functional.embedding_bag`, the op
    sentence-transformers' `nn.EmbeddingBag` runs), as a backend: `input_ids` [N] (every
    input's ids laid end to end) and `offsets` [B] (where each input starts) -> float32 [B, D]."""

    name = "torch"
    dtype = "float32"
    compute = "packed"  # a batch computes its real tokens only

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            return torch.nn.functional.embedding_bag(
                inputs["input_ids"], self.weight, inputs["offsets"], mode="mean"
            )


class StaticEngine:
    """A `StaticEmbedding` model (its tokenizer and [vocabulary, D] float32 rows)."""

    def __init__(self, tokenizer: Tokenizer, weight: torch.Tensor, info: ModelInfo) -> None:
        from transformers import PreTrainedTokenizerFast

        self.tok = tokenizer
        self.backend: Backend = EmbeddingBag(weight)
        self.info = info
        self.calibration: Calibration | None = None  # int8 ranges (loading.quantization)
        # /tokenize and /decode, as the encoder engine answers them, on the same tokenizer
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
        self.tokenizer = UnitTokenizer(wrapped, info, None)

    # -- per unit ------------------------------------------------------------------------
    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize one unit; raises `InvalidInput` (422) for an input it cannot take."""
        found = self.prepare_many([unit])[0]
        if isinstance(found, Exception):
            raise found
        return found

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        """Each unit's ids (texts in one tokenizer call: the tokenizers library encodes the
        list in Rust), in order; a unit's failure is its own entry."""
        texts = [k for k, u in enumerate(units) if u.op not in NO_FORWARD and u.ids is None]
        encoded = self.tok.encode_batch(
            [self._text(units[k]) for k in texts], add_special_tokens=False
        )
        ids_of = {k: e.ids for k, e in zip(texts, encoded, strict=True)}
        out: list[Prepared | Exception] = []
        for k, unit in enumerate(units):
            try:
                if unit.op in NO_FORWARD:
                    out.append(self.tokenizer.prepare(unit))
                else:
                    out.append(self._prepared(unit, ids_of.get(k)))
            except InvalidInput as exc:
                out.append(exc)
        return out

    def _text(self, unit: Unit) -> str:
        """`prompt + text`, the prompt named by the unit (None: the model's default)."""
        assert unit.text is not None
        name = unit.params.prompt_name
        if name is None:
            name = self.info.default_prompt_name or ""
        return self.info.prompts.get(name, "") + unit.text if name else unit.text

    def _prepared(self, unit: Unit, ids: list[int] | None) -> Prepared:
        params = narrow(unit.params, EmbedParams)
        if params.late_chunks is not None:
            raise InvalidInput(
                "late_chunking is not served by a static embedding model: its token vectors "
                "do not depend on their context, so each chunk's vector is the chunk's own "
                "(embed the chunks as inputs)"
            )
        if ids is None:
            assert unit.ids is not None
            ids = list(unit.ids)
            _check_vocabulary(ids, self.info.vocab_size)
        limit = params.max_tokens
        if limit is not None and len(ids) > limit:
            if not params.truncate:
                metrics.LONG_INPUTS.labels("refused").inc()
                raise InvalidInput(f"input is {len(ids)} tokens; max_tokens is {limit}")
            metrics.LONG_INPUTS.labels("truncated").inc()
            ids = ids[-limit:] if params.direction == "left" else ids[:limit]
        # at least 1: the batch policy and cost model count an input's tokens
        return Prepared(unit=unit, n_tokens=max(len(ids), 1), payload=ids)

    # -- per batch -----------------------------------------------------------------------
    def run(self, batch: list[Prepared]) -> list[Any]:
        """One embedding bag over the batch's ids; each unit's vector cut and normalized as
        its params say (`Ranged` with the int8 ranges where asked; `Counted` with its tokens
        where asked). Raises what torch raises."""
        import torch

        rows: list[list[int]] = [p.payload for p in batch]
        offsets = np.cumsum([0] + [len(r) for r in rows[:-1]])
        flat = np.fromiter((i for r in rows for i in r), dtype=np.int64)
        inputs = {"input_ids": torch.from_numpy(flat), "offsets": torch.from_numpy(offsets)}
        vectors = self.backend.forward(inputs).numpy()
        out: list[Any] = []
        for p, vector in zip(batch, vectors, strict=True):
            params = narrow(p.unit.params, EmbedParams)
            answer: Any = _finish(vector, params.normalize, params.dimensions)
            if params.ranges:
                assert self.calibration is not None  # adapters ask only where it was made
                answer = Ranged(
                    answer, self.calibration.ranges(params.normalize, params.dimensions)
                )
            out.append(Counted(answer, len(p.payload)) if params.count_tokens else answer)
        return out


def _finish(vector: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """Cut to `dimensions`, then L2-normalize if asked (eps 1e-12, torch's `F.normalize`):
    `service.engine.pooling.pool.finish` on one float32 vector."""
    if dimensions is not None:
        if not 1 <= dimensions <= vector.shape[-1]:
            raise ValueError(f"dimensions must be 1..{vector.shape[-1]}, not {dimensions}")
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return np.ascontiguousarray(vector, dtype=np.float32)


def _check_vocabulary(ids: Sequence[int], vocab: int) -> None:
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise InvalidInput(f"token id {bad} is outside this model's vocabulary (0..{vocab - 1})")
