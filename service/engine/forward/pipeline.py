"""The pipeline engine (fill-mask, token-classification).

`PipelineEngine` runs tasks whose pre- and post-processing is the pipeline's own
(fill-mask, token-classification) through the pipeline's `preprocess` / `forward` /
`postprocess`, so answers stay the pipeline's; what we own there is how inputs are grouped and
collated (`pad_collate_fn`, the pipeline's own collator) and how padded outputs are cut back to
each input's own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.engine.jobs import Unit
from service.engine.params import PipelineParams, narrow
from service.engine.types import ModelInfo, Prepared, prepare_each
from service.errors import InvalidInput

if TYPE_CHECKING:
    import torch
    from transformers import Pipeline


_MAX_CACHED_PARAMETER_SETS = 256


# Fill-mask answers at most this many predictions per input (mask tokens x top_k). The pipeline
# decodes the whole input once per prediction, so without a bound one short request with many
# masks and a top_k clamped to the vocabulary would hold the model for minutes.
MAX_FILL_MASK_PREDICTIONS = 1000


@dataclass(frozen=True, kw_only=True)
class Calls:
    """The pipeline's sanitized parameters for one parameter set, computed once and cached."""

    preprocess: dict[str, Any]
    forward: dict[str, Any]
    postprocess: dict[str, Any]
    truncation: bool  # cut inputs over the model's limit (else: 422 naming the limit)


@dataclass(eq=False)
class PipelineEngine:
    """A loaded fill-mask or token-classification pipeline plus the per-parameter-set state
    it needs. Units are `Op.PIPELINE`; their `params` are `PipelineParams`: the task's
    validated arguments (`service.protocols.params`). Inference thread only."""

    pipe: Pipeline
    info: ModelInfo
    _calls: dict[PipelineParams, Calls] = field(default_factory=dict)

    # -- parameters ---------------------------------------------------------------------
    def calls_for(self, params: PipelineParams) -> Calls:
        """The pipeline's (preprocess, forward, postprocess) kwargs for `params`, cached by them.

        Raises `InvalidInput` when the pipeline rejects the values (e.g. unknown targets).
        """
        if params in self._calls:
            return self._calls[params]
        if len(self._calls) >= _MAX_CACHED_PARAMETER_SETS:  # e.g. many distinct `targets`
            self._calls.pop(next(iter(self._calls)))
        user = {k: list(v) if isinstance(v, tuple) else v for k, v in params.arguments}
        truncation = params.truncate
        task = self.info.task
        if task == "fill-mask" and "top_k" in user:
            user["top_k"] = min(user["top_k"], self.info.vocab_size)
        if task == "fill-mask":
            user["tokenizer_kwargs"] = {"truncation": truncation}
        try:
            pre, fwd, post = self.pipe._sanitize_parameters(**user)
        except Exception as exc:  # the pipeline's own checks (ValueError, PipelineException)
            raise InvalidInput(f"invalid parameters: {_safe(exc)}") from exc
        calls = Calls(
            preprocess={**self.pipe._preprocess_params, **pre},
            forward={**self.pipe._forward_params, **fwd},
            postprocess={**self.pipe._postprocess_params, **post},
            truncation=truncation,
        )
        self._calls[params] = calls
        return calls

    # -- per input ----------------------------------------------------------------------
    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        """`prepare` for each unit in turn (the pipeline's `preprocess` takes one input)."""
        return prepare_each(self.prepare, units)

    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize one input with the pipeline's `preprocess`; check its length exactly.

        Raises `InvalidInput` for an input the pipeline rejects (no mask token), one over
        the model's token limit when truncation is off (the message names the limit), and a
        fill-mask input asking for more than MAX_FILL_MASK_PREDICTIONS (masks x top_k).
        """
        from transformers.pipelines.base import ChunkPipeline, PipelineException

        text = unit.text
        assert text is not None
        calls = self.calls_for(narrow(unit.params, PipelineParams))
        try:
            out = self.pipe.preprocess(text, **calls.preprocess)
            chunks = list(out) if isinstance(self.pipe, ChunkPipeline) else [out]
        except PipelineException as exc:
            mask = self.info.mask_token
            if mask and "mask_token" in str(exc):
                if calls.truncation and mask in text:  # it was there, past the cut
                    raise InvalidInput(
                        f"truncation cut off the mask token {mask}: this model keeps the first "
                        f"{self.info.max_input_tokens} tokens (put the mask earlier)"
                    ) from exc
                raise InvalidInput(self.no_mask_message()) from exc
            raise InvalidInput(f"the pipeline rejected this input: {_safe(exc)}") from exc
        except ValueError as exc:
            raise InvalidInput(f"the pipeline rejected this input: {_safe(exc)}") from exc
        n_tokens = max(int(c["input_ids"].shape[-1]) for c in chunks)
        if not calls.truncation:
            self._check_length(text, n_tokens)
        if self.info.mask_token is not None:
            self._check_predictions(chunks[0]["input_ids"], calls)
        return Prepared(unit=unit, n_tokens=n_tokens, payload=_Chunks(chunks, calls))

    def _check_predictions(self, input_ids: torch.Tensor, calls: Calls) -> None:
        """Fill-mask: at most MAX_FILL_MASK_PREDICTIONS predictions (masks x top_k) per input."""
        masks = int((input_ids == self.pipe.tokenizer.mask_token_id).sum())
        top_k = int(calls.postprocess.get("top_k", 5))
        targets = calls.postprocess.get("target_ids")
        if targets is not None:
            top_k = min(top_k, int(targets.shape[0]))  # what the pipeline's postprocess does
        if masks * top_k > MAX_FILL_MASK_PREDICTIONS:
            raise InvalidInput(
                f"{masks} mask token(s) x top_k {top_k} is {masks * top_k} predictions; at most "
                f"{MAX_FILL_MASK_PREDICTIONS} per input (lower top_k or send fewer masks)"
            )

    def no_mask_message(self) -> str:
        return f"fill-mask needs the mask token {self.info.mask_token} in every input"

    def _check_length(self, text: str, n_tokens: int) -> None:
        limit = self.info.max_input_tokens
        if n_tokens == limit and self.info.task == "token-classification":
            # This pipeline truncates by itself: count again, uncut, only at the boundary.
            n_tokens = len(self.pipe.tokenizer(text, truncation=False)["input_ids"])
        if n_tokens > limit:
            raise InvalidInput(
                f"input is {n_tokens} tokens; this model takes at most {limit} tokens "
                "(shorten it, or send JSON with parameters.truncation=true to cut it)"
            )

    # -- per batch ----------------------------------------------------------------------
    def run(self, batch: list[Prepared]) -> list[object]:
        """Run one batch (all with the same parameters) and return each input's answer.

        Shapes: `batch` holds N inputs; the pipeline's forward sees one padded tensor of
        [sum of chunks, longest chunk tokens]. Raises whatever the model raises.
        """
        from transformers.pipelines.base import ChunkPipeline, pad_collate_fn
        from transformers.pipelines.pt_utils import PipelineIterator

        pipe = self.pipe
        work: list[_Chunks] = [p.payload for p in batch]
        # Forward parameters are the same for every parameter set of these two tasks (none),
        # so units with different parameters share a batch; each keeps its own postprocess.
        forward = work[0].calls.forward
        units = [c for w in work for c in w.chunks]
        if len(units) == 1:
            outputs = [pipe.forward(units[0], **forward)]
        else:
            collate = pad_collate_fn(pipe.tokenizer, pipe.feature_extractor)
            padded = pipe.forward(collate(units), **forward)
            # The pipeline's own un-batching (what `pipe(list, batch_size=N)` does).
            outputs = list(
                PipelineIterator([padded], lambda x: x, {}, loader_batch_size=len(units))
            )
        answers: list[object] = []
        start = 0
        chunked = isinstance(pipe, ChunkPipeline)
        for w in work:
            mine = outputs[start : start + len(w.chunks)]
            start += len(w.chunks)
            answers.append(pipe.postprocess(mine if chunked else mine[0], **w.calls.postprocess))
        return answers


@dataclass(eq=False, slots=True)
class _Chunks:
    """A pipeline unit's preprocessed chunks (one unless the task chunks) and its parameters."""

    chunks: list[dict[str, Any]]
    calls: Calls


def _safe(exc: BaseException) -> str:
    """An exception's message, made safe to show: one line, short, no paths."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300] if "/" not in text else type(exc).__name__
