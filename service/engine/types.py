"""The engines' shared types: what the loaded model is (`ModelInfo`), a prepared input
(`Prepared`), and the `Engine` protocol both engines implement.

Only the inference thread calls into the engines (torch and transformers are imported lazily,
so the event loop never pays for them; loading lives in `service.engine.loading.load`). Two engines
serve the tasks: `service.engine.forward.encoder.EncoderEngine` runs text encoders and
classifiers on batches it pads itself; `service.engine.forward.pipeline.PipelineEngine` runs
tasks whose pre- and post-processing is the pipeline's own (fill-mask, token-classification).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from service.engine.jobs import Op, Unit


class Output(StrEnum):
    """What the loaded model answers: the one description every place that depends on it reads.

    `POOLED`, `SPARSE` and `TOKEN_ROWS` are feature-extraction models served by the encoder
    engine; `CLASSIFIER` a sequence classifier (text-classification, zero-shot, cross-encoder),
    also the encoder engine's; `PIPELINE` fill-mask and token-classification, the pipeline
    engine's; `MULTI_VECTOR` a late-interaction model's token vectors, the multi-vector
    engine's (`service.engine.multi_vector`)."""

    POOLED = "pooled"  # sentence embeddings [D] (pooling, Dense heads); token rows too
    SPARSE = "sparse"  # SPLADE: MLM logits pooled into vocabulary-wide sparse embeddings
    TOKEN_ROWS = "token_rows"  # the last hidden state per token only (no pooling config)
    CLASSIFIER = "classifier"  # logits [labels] per text or pair
    PIPELINE = "pipeline"  # the transformers pipeline's own answers
    MULTI_VECTOR = "multi_vector"  # token vectors [tokens, D] per text (ColBERT-style)

    @property
    def op(self) -> Op:
        """The op of the model's main answer (warm-up, calibration, `POST /`)."""
        return _MAIN_OP[self]


_MAIN_OP = {
    Output.POOLED: Op.EMBED,
    Output.SPARSE: Op.SPARSE,
    Output.TOKEN_ROWS: Op.ROWS,
    Output.CLASSIFIER: Op.LOGITS,
    Output.PIPELINE: Op.PIPELINE,
    Output.MULTI_VECTOR: Op.MULTI_VECTOR,
}


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What the event loop needs to know about the loaded model (read-only, set once).

    `output`: what it answers (`Output`); `ops`: the units it computes (`service.engine.jobs.Op`);
    `pooling`: the sentence-embedding pooling modes (None: none pooled); `normalize`: the model's
    own pipeline ends in a Normalize module; `dimension`: the embedding width (SPARSE: the
    vocabulary); `labels`: the classifier's labels by index; `entailment_id`: the NLI label
    zero-shot reads (-1: none); `prompts`: the sentence-transformers prompts by name (with ST's
    "query" and "document", empty where the folder has none; /info lists those with text).
    """

    model_id: str
    revision: str | None
    task: str
    output: Output
    ops: frozenset[Op]
    device: str
    dtype: str
    torch_threads: int
    max_input_tokens: int
    mask_token: str | None
    vocab_size: int
    pooling: tuple[str, ...] | None = None
    normalize: bool = False
    dimension: int | None = None
    labels: tuple[str, ...] = ()
    entailment_id: int = -1
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    served_name: str = ""  # the name answers give the model (OpenAI's `model`): no paths
    modules: tuple[str, ...] = ()  # the sentence-transformers module chain, for /info
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: not trained for cutting
    # How batches are computed (`service.backends`): "torch" or "onnx", and /info's `backend`
    # object (the served one, each candidate's inputs/s and quality, the choice's seconds).
    backend: str = "torch"
    backend_summary: Mapping[str, Any] = field(default_factory=dict)
    # A multi-vector model: its token vectors' width, scoring (maxsim, meanmaxsim), lengths.
    multi_vector: Mapping[str, Any] | None = None
    # A BGE-M3 model (`service.engine.pooling.m3`): each output's width, one call's outputs.
    hybrid: Mapping[str, Any] | None = None
    # A static embedding model (`service.engine.static`): its width, vocabulary, the tokens
    # its tokenizer cuts at (None: no limit) and the layout its rows were read from.
    static: Mapping[str, Any] | None = None
    # int8/uint8 calibration (`service.engine.loading.quantization`): texts, sha256, source,
    # seconds.
    calibration: Mapping[str, Any] | None = None
    # A cross-encoder's activation of its logit, as `CrossEncoder.predict` applies it
    # (`st_config.score_activation`): "sigmoid", "identity", "tanh", or the class it names.
    score_activation: str = "sigmoid"
    # "packed": batches compute their real tokens only (`service.backends.packed`); "padded":
    # inputs x the longest. The batch policy and its cost model count tokens this way.
    compute: str = "padded"
    # Batches of at most this many padded tokens (inputs x the longest) run padded even when
    # `compute` is "packed": the small-batch backend of a route that pads
    # (`service.backends.routed`); 0: none.
    padded_up_to: int = 0

    @property
    def limit(self) -> int | None:
        """The most tokens an input may have, as /info says it: None for a model without a
        limit (a static embedding model whose tokenizer does not cut)."""
        return self.static["max_input_tokens"] if self.static else self.max_input_tokens

    def summary(self) -> dict[str, Any]:
        """What the model is and how it answers, for /info and the `model_ready` log line."""
        return {
            "model_id": self.model_id,
            "served_name": self.served_name,
            "revision": self.revision,
            "task": self.task,
            "device": self.device,
            "dtype": self.dtype,
            "torch_threads": self.torch_threads,
            "max_input_tokens": self.limit,
            "pooling": list(self.pooling) if self.pooling else None,
            "normalize": self.normalize,
            "dimension": self.dimension,
            "labels": list(self.labels) or None,
            "mask_token": self.mask_token,
            "vocab_size": self.vocab_size,
            "prompts": sorted(name for name, text in self.prompts.items() if text) or None,
            "default_prompt_name": self.default_prompt_name,
            "sparse": self.output is Output.SPARSE,
            "multi_vector": dict(self.multi_vector) if self.multi_vector else None,
            "hybrid": dict(self.hybrid) if self.hybrid else None,
            "static": dict(self.static) if self.static else None,
            "modules": list(self.modules) or None,
            "matryoshka_dimensions": _matryoshka(self.matryoshka_dimensions),
            "backend": dict(self.backend_summary)
            or {"name": self.backend, "dtype": self.dtype, "compute": self.compute},
            "calibration": dict(self.calibration) if self.calibration else None,
            "score_activation": (
                self.score_activation if self.output is Output.CLASSIFIER else None
            ),
        }

    def ready_fields(self, loaded_s: float) -> dict[str, Any]:
        """The `model_ready` line, said once per start (under 300 characters; the whole picture
        is /info's `summary`): the model, the backend and dtype served (and the small-batch
        one), whether the backend choice was measured or reused from the cache
        (`service.engine.loading.choice.choice_cache`) and its seconds, the seconds from the start
        of the load to ready (`load_s`, warm-up included)."""
        backend = dict(self.backend_summary)
        fields: dict[str, Any] = {
            "model": (self.served_name or self.model_id)[:80],
            "backend": self.backend,
            "dtype": self.dtype,
        }
        if small := backend.get("small_batches"):
            fields["small_batches"] = (
                f"{small['backend']} {small['dtype']} to {small['max_padded_tokens']} tokens"
            )
        if "choice_s" in backend:  # reused from the cache, measured, or the only candidate
            measured = len(backend.get("candidates", ())) > 1
            fields["choice"] = (
                "reused" if backend.get("reused") else ("measured" if measured else "fixed")
            )
            fields["choice_s"] = backend["choice_s"]
        fields["load_s"] = round(loaded_s, 2)
        return fields


#: Late chunking's limits (`service.engine.forward.late`): a joined document of at most this
#: many windows' worth of tokens, each window starting with at most `LATE_OVERLAP_TOKENS` of
#: context before its first chunk (jina-ai/late-chunking's `long_late_chunking_overlap_size`).
LATE_MAX_WINDOWS = 16
LATE_OVERLAP_TOKENS = 256


def late_limits(max_input_tokens: int) -> dict[str, int]:
    """Late chunking's limits on a model of `max_input_tokens` (/info's `late_chunking`): the
    joined text's most tokens, a window's tokens (special tokens included) and the context
    tokens a window keeps before its first chunk (a quarter of a window, at most 256)."""
    return {
        "max_tokens": LATE_MAX_WINDOWS * max_input_tokens,
        "window_tokens": max_input_tokens,
        "overlap_tokens": min(LATE_OVERLAP_TOKENS, max_input_tokens // 4),
    }


def _matryoshka(dims: tuple[int, ...] | None) -> list[int] | str | None:
    """/info's view: the widths it was trained for, "any", or None (not trained for cuts)."""
    return None if dims is None else (list(dims) or "any")


@dataclass(eq=False, kw_only=True)
class Prepared:
    """One unit after tokenization: what its engine needs to run it in a batch.

    `n_tokens`: its padded length (padding decides cost); `payload`: the engine's own (the
    pipeline's preprocessed chunks, or `service.engine.forward.encoder.Encoded`); `answer`: set
    instead for ops that need no forward (tokenize, decode). `parts`: set for an input computed
    as several units (a long input's windows, `service.engine.forward.windows`), each batched
    as an input of its own; `merge` turns their answers, in order, into this unit's."""

    unit: Unit
    n_tokens: int
    payload: Any = None
    answer: Any = None
    parts: tuple[Prepared, ...] = ()
    merge: Callable[[list[Any]], Any] | None = None


class Engine(Protocol):
    """What the batcher needs of an engine. Inference thread only."""

    info: ModelInfo

    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize `unit` (exact length checks); raises `InvalidInput` for a bad input."""
        ...

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        """`prepare` for each unit, in order; a unit's failure is its entry (the exception)."""
        ...

    def run(self, batch: list[Prepared]) -> list[Any]:
        """Each unit's answer, in order, from one forward pass; raises what the model raises."""
        ...


def prepare_each(
    prepare: Callable[[Unit], Prepared], units: Sequence[Unit]
) -> list[Prepared | Exception]:
    """`prepare(unit)` for each unit, in order, an exception it raised standing in its place."""
    out: list[Prepared | Exception] = []
    for unit in units:
        try:
            out.append(prepare(unit))
        except Exception as exc:
            out.append(exc)
    return out
