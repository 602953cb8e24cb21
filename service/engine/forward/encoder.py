"""The encoder engine: our own tokenize -> padded batch -> forward for text-encoder models.

Serves embedding models (feature-extraction: token rows and pooled sentence embeddings) and
sequence classifiers (text-classification, zero-shot-classification, cross-encoders) with the
pipeline's tokenizer and model, but without the pipeline's per-input Python: one tokenizer call
per input (the tokenizers library runs in Rust), one padded numpy batch per forward, and
answers cut from the batch's outputs. Inference thread only.

Tokenizing is `service.engine.forward.tokenizing`; the options each op reads are in
`service.engine.params` (`EmbedParams` for pooled vectors, SPLADE and BGE-M3 answers,
`PairParams` for classifiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from service.backends import Backend
from service.backends.torch_backend import TorchBackend
from service.engine.forward.tokenizing import Encoded, UnitTokenizer
from service.engine.jobs import Counted, Op, Unit
from service.engine.params import PairParams, narrow
from service.engine.pooling import outputs
from service.engine.pooling.sentence import SentenceConfig
from service.engine.types import ModelInfo, Output, Prepared

if TYPE_CHECKING:
    from transformers import Pipeline

    from service.engine.pooling.calibration import Calibration


class EncoderEngine:
    """A text encoder (`pipe.model`, `pipe.tokenizer`) run on padded batches of units."""

    def __init__(
        self,
        pipe: Pipeline,
        info: ModelInfo,
        sentence: SentenceConfig | None,
        backend: Backend | None = None,
    ) -> None:
        self.pipe = pipe
        # How the forward is computed (`service.backends`); default: the pipeline's own model.
        self.backend: Backend = backend or TorchBackend(pipe.model, pipe.device)
        self.info = info
        self.sentence = sentence
        tok = pipe.tokenizer
        assert tok is not None
        self.tok = tok
        self.tokenizer = UnitTokenizer(tok, info, sentence)
        self.left = tok.padding_side == "left"
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        self.types = "token_type_ids" in tok.model_input_names
        self.heads = outputs.load_heads(sentence, pipe.device)  # Dense modules, float32
        self.m3 = outputs.load_m3(sentence, pipe.model.config, tok, pipe.device)  # or None
        self.calibration: Calibration | None = None  # int8 ranges (engine.quantization)

    # -- per unit: `service.engine.forward.tokenizing` ------------------------------------
    def prepare(self, unit: Unit) -> Prepared:
        """Tokenize `unit` (exact length checks); raises `InvalidInput` (422) for a bad input."""
        return self.tokenizer.prepare(unit)

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        """`prepare` for each unit, in order; a unit's failure is its own entry."""
        return self.tokenizer.prepare_many(units)

    # -- per batch -----------------------------------------------------------------------
    def run(self, batch: list[Prepared]) -> list[Any]:
        """One forward over the padded batch; each unit's answer cut from its own row.

        Shapes: input_ids/attention_mask [B, L] (L: the longest unit); the encoder's last
        hidden state [B, L, H] or the classifier's logits [B, labels]. Raises what the model
        raises.
        """
        encoded: list[Encoded] = [p.payload for p in batch]
        lengths = np.array([len(e.ids) for e in encoded])
        inputs = self._pad(encoded, lengths)
        output = self.backend.forward(inputs)  # float32 on the CPU (service.backends)
        if self.info.output is Output.CLASSIFIER:
            logits = output
            answers = [self._classified(p.unit, logits[i : i + 1]) for i, p in enumerate(batch)]
            return _with_counts(batch, answers)
        answers = self._answers(batch, output, inputs, lengths)
        return _with_counts(batch, answers)

    def _answers(
        self, batch: list[Prepared], first: Any, inputs: dict[str, Any], lengths: Any
    ) -> list[Any]:
        """Each unit's answer from the model's first output (`first`: [B, L, H] token rows, or
        a masked-LM model's [B, L, vocab] logits): pooled (+ Dense heads), SPLADE, BGE-M3's
        heads, or rows."""
        hidden = first.float()  # a no-op for the backends' float32 output
        mask = inputs["attention_mask"]
        answers: list[Any] = [None] * len(batch)
        for found in (
            outputs.embed_rows(
                batch, hidden, mask, self.info.pooling, self.heads, self.calibration
            ),
            outputs.m3_rows(batch, hidden, mask, inputs["input_ids"], self.m3)
            if self.m3 is not None
            else outputs.sparse_rows(batch, hidden, mask, self.sentence),
        ):
            for i, answer in found.items():
                answers[i] = answer
        if not any(p.unit.op is Op.ROWS for p in batch):
            return answers
        rows = hidden.cpu().numpy()
        width = rows.shape[1]
        for i, p in enumerate(batch):
            if p.unit.op is Op.ROWS:
                n = int(lengths[i])
                answers[i] = rows[i, width - n :] if self.left else rows[i, :n]
        return answers

    def _pad(self, encoded: list[Encoded], lengths: np.ndarray) -> dict[str, Any]:
        import torch

        width = int(lengths.max())
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        types = np.zeros((len(encoded), width), dtype=np.int64) if self.types else None
        for i, e in enumerate(encoded):
            cols = slice(width - len(e.ids), width) if self.left else slice(0, len(e.ids))
            ids[i, cols] = e.ids
            mask[i, cols] = 1
            if types is not None and e.type_ids is not None:
                types[i, cols] = e.type_ids
        out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if types is not None:
            out["token_type_ids"] = torch.from_numpy(types)
        return out

    def padded(self, batch: list[Prepared]) -> dict[str, Any]:
        """The int64 inputs [B, L] (L: the longest unit) the backend gets for `batch`."""
        encoded: list[Encoded] = [p.payload for p in batch]
        return self._pad(encoded, np.array([len(e.ids) for e in encoded]))

    def _classified(self, unit: Unit, logits: Any) -> Any:
        """`logits`: float32 [labels]; `classify`: what the text-classification pipeline
        answers with `top_k` (None: every label, highest first) and `function_to_apply`."""
        if unit.op is Op.LOGITS:
            return logits[0].numpy()
        from transformers.pipelines.text_classification import ClassificationFunction

        params = narrow(unit.params, PairParams)
        function = params.function_to_apply
        return self.pipe.postprocess(
            {"logits": logits},
            function_to_apply=None if function is None else ClassificationFunction(function),
            top_k=params.top_k,
            _legacy=False,
        )


def _with_counts(batch: list[Prepared], answers: list[Any]) -> list[Any]:
    """Each answer whose unit asked for `count_tokens` as `Counted(answer, its tokens)`."""
    return [
        Counted(a, p.n_tokens) if p.unit.params.count_tokens else a
        for p, a in zip(batch, answers, strict=True)
    ]
