"""The engine: run a loaded `transformers` pipeline on batches formed by the batcher.

Only the inference thread calls into this module (torch and transformers are imported lazily,
so the event loop never pays for them; loading lives in `service.loading`). A batch runs
through the pipeline's own `preprocess` / `forward` / `postprocess`, so answers stay the
pipeline's; what we own is how inputs are grouped and collated (`pad_collate_fn`, the
pipeline's own collator) and how padded outputs are cut back to each input's own length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput
from service.params import Hashable

if TYPE_CHECKING:
    from transformers import Pipeline


_MAX_CACHED_PARAMETER_SETS = 256
# Fill-mask answers at most this many predictions per input (mask tokens x top_k). The pipeline
# decodes the whole input once per prediction, so without a bound one short request with many
# masks and a top_k clamped to the vocabulary held the model for minutes (README, Parameters).
MAX_FILL_MASK_PREDICTIONS = 1000


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What the event loop needs to know about the loaded model (read-only, set once)."""

    model_id: str
    revision: str | None
    task: str
    device: str
    dtype: str
    torch_threads: int
    max_input_tokens: int
    mask_token: str | None
    vocab_size: int


@dataclass(eq=False, kw_only=True)
class Prepared:
    """One input after the pipeline's `preprocess`: its chunks (one unless the task chunks)."""

    chunks: list[dict[str, Any]]
    n_tokens: int  # the longest chunk's token count (padding decides cost)
    calls: Calls


@dataclass(frozen=True, kw_only=True)
class Calls:
    """The pipeline's sanitized parameters for one parameter set, computed once and cached."""

    preprocess: dict[str, Any]
    forward: dict[str, Any]
    postprocess: dict[str, Any]
    truncation: bool  # cut inputs over the model's limit (else: 422 naming the limit)


@dataclass(eq=False)
class Engine:
    """A loaded pipeline plus the per-parameter-set state it needs. Inference thread only."""

    pipe: Pipeline
    info: ModelInfo
    truncate_default: bool
    _calls: dict[Hashable, Calls] = field(default_factory=dict)

    # -- parameters ---------------------------------------------------------------------
    def calls_for(self, key: Hashable, params: dict[str, Any]) -> Calls:
        """The pipeline's (preprocess, forward, postprocess) kwargs for `params`, cached by key.

        Raises `InvalidInput` when the pipeline rejects the values (e.g. unknown targets).
        """
        if key in self._calls:
            return self._calls[key]
        if len(self._calls) >= _MAX_CACHED_PARAMETER_SETS:  # e.g. many distinct `targets`
            self._calls.pop(next(iter(self._calls)))
        user = dict(params)
        truncation = bool(user.pop("truncation", self.truncate_default))
        task = self.info.task
        if task == "fill-mask" and "top_k" in user:
            user["top_k"] = min(user["top_k"], self.info.vocab_size)
        if task == "feature-extraction":
            user["return_tensors"] = True  # numpy out, encoded by orjson: same float32 values
            user["truncation"] = truncation
        elif task == "fill-mask":
            user["tokenizer_kwargs"] = {"truncation": truncation}
        elif task == "text-classification":
            user["truncation"] = truncation
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
        self._calls[key] = calls
        return calls

    # -- per input ----------------------------------------------------------------------
    def prepare(self, text: str, key: Hashable, params: dict[str, Any]) -> Prepared:
        """Tokenize one input with the pipeline's `preprocess`; check its length exactly.

        Raises `InvalidInput` for an input the pipeline rejects (no mask token), one over
        the model's token limit when truncation is off (the message names the limit), and a
        fill-mask input asking for more than MAX_FILL_MASK_PREDICTIONS (masks x top_k).
        """
        from transformers.pipelines.base import ChunkPipeline, PipelineException

        calls = self.calls_for(key, params)
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
        return Prepared(chunks=chunks, n_tokens=n_tokens, calls=calls)

    def _check_predictions(self, input_ids: Any, calls: Calls) -> None:
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
    def run(self, batch: list[Prepared]) -> list[Any]:
        """Run one batch (all with the same parameters) and return each input's answer.

        Shapes: `batch` holds N inputs; the pipeline's forward sees one padded tensor of
        [sum of chunks, longest chunk tokens]. Raises whatever the model raises.
        """
        from transformers.pipelines.base import ChunkPipeline, pad_collate_fn
        from transformers.pipelines.pt_utils import PipelineIterator

        pipe = self.pipe
        calls = batch[0].calls
        units = [c for p in batch for c in p.chunks]
        if len(units) == 1:
            outputs = [pipe.forward(units[0], **calls.forward)]
        else:
            collate = pad_collate_fn(pipe.tokenizer, pipe.feature_extractor)
            padded = pipe.forward(collate(units), **calls.forward)
            # The pipeline's own un-batching (what `pipe(list, batch_size=N)` does).
            outputs = list(
                PipelineIterator([padded], lambda x: x, {}, loader_batch_size=len(units))
            )
        answers: list[Any] = []
        start = 0
        chunked = isinstance(pipe, ChunkPipeline)
        for p in batch:
            mine = outputs[start : start + len(p.chunks)]
            start += len(p.chunks)
            if self.info.task == "feature-extraction":
                mine = [
                    self._cut_padding(o, int(c["input_ids"].shape[-1]))
                    for o, c in zip(mine, p.chunks, strict=True)
                ]
            answer = pipe.postprocess(mine if chunked else mine[0], **calls.postprocess)
            answers.append(self._as_single_call(answer, calls))
        return answers

    def _as_single_call(self, answer: Any, calls: Calls) -> Any:
        """What `pipe(text)` returns for this one input: text-classification without
        `top_k` wraps its answer in a list (the pipeline's legacy single-string form)."""
        if hasattr(answer, "numpy"):
            return answer.float().numpy()  # feature-extraction rows (bf16/fp16 widened)
        if self.info.task == "text-classification" and calls.postprocess.get("_legacy", True):
            return [answer]
        return answer

    def _cut_padding(self, output: Any, n_tokens: int) -> Any:
        """Feature-extraction: a padded batch gives each input the longest input's token rows;
        keep this input's own rows (transformers 5 pads batched answers)."""
        hidden = output[0]
        if hidden.shape[1] == n_tokens:
            return output
        left = self.pipe.tokenizer.padding_side == "left"
        output[next(iter(output.keys()))] = hidden[:, -n_tokens:] if left else hidden[:, :n_tokens]
        return output


def _safe(exc: BaseException) -> str:
    """An exception's message, made safe to show: one line, short, no paths."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300] if "/" not in text else type(exc).__name__


@dataclass(frozen=True)
class BatchCost:
    """A batch of `padded` tokens costs `sec_per_token x (overhead_tokens + padded)` seconds."""

    overhead_tokens: float
    sec_per_token: float


def calibrate(engine: Engine) -> BatchCost:
    """Fit the batch cost model from a 1 x 64-token batch and a 16 x 64-token batch, best of 3
    each (warm, unlike the first call). Both are 64 tokens long, so the fitted overhead also
    holds what large batches gain per token (better-filled matrix products), not only the
    fixed cost of a call. Clamped to [8, 4096] tokens. The selector trades padding against the
    overhead; admission starts from this model."""
    word = "word " if engine.info.mask_token is None else f"{engine.info.mask_token} "
    one = [engine.prepare(word * 62, (), {})]
    many = one * 16

    def best_of_3(batch: list[Prepared]) -> tuple[float, int]:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            engine.run(batch)
            times.append(time.perf_counter() - started)
        return min(times), len(batch) * max(p.n_tokens for p in batch)

    t_one, p_one = best_of_3(one)
    t_many, p_many = best_of_3(many)
    per_token = max(t_many - t_one, 1e-9) / max(p_many - p_one, 1)
    overhead = min(max(max(t_one - per_token * p_one, 0.0) / per_token, 8.0), 4096.0)
    return BatchCost(overhead_tokens=overhead, sec_per_token=t_one / (overhead + p_one))


def warm_up(engine: Engine) -> float:
    """Run one batch of two inputs through the same path as traffic; return its seconds."""
    suffix = f" {engine.info.mask_token}" if engine.info.mask_token else ""
    texts = ["Warm up" + suffix, "A somewhat longer sentence to warm the model up" + suffix]
    started = time.perf_counter()
    engine.run([engine.prepare(t, (), {}) for t in texts])
    return time.perf_counter() - started
