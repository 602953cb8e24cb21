"""Padding-free (packed) forward of BERT-family encoders on torch, with the model's own modules.

A padded batch computes B x L tokens, of which only T are real; on the benchmark's short corpus
batches of 32 in arrival order compute 1.86 tokens per real token. Packed, the batch's real
tokens are concatenated into one [T, H] matrix and every token-wise part of the encoder runs on
it: the embeddings (word, position and token-type lookups and their layer norm), the query,
key, value and output projections, the feed-forward layers and the layer norms, more than 90%
of the FLOPs at these lengths. Only attention sees the sequences apart
(`service.backends.packing.Packing.attend`: a padded SDPA with a key mask over the packed
rows). The output is scattered back to the padded shape the engine expects ([B, L, H] token
rows or [B, L, vocab] masked-LM logits, zeros at padding) or is a classifier's [B, labels].

Supported: the model's own `BertModel`, `RobertaModel`, `XLMRobertaModel` and `MPNetModel`
(MiniLM, e5, bge and gte are BERTs), their `...ForSequenceClassification` (rerankers, NLI for
zero-shot) and `...ForMaskedLM` (SPLADE); every weight is the loaded model's, every module is
called as the model calls it, and positions are the ones the model gives a padded batch
(BERT: 0..L-1; RoBERTa/XLM-R/MPNet: counting non-padding tokens from `padding_idx + 1`,
fairseq's `make_positions`). Anything else (ModernBERT, decoders, relative position
embeddings, cross-attention) runs padded: `unsupported` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from service.backends.packing import Packing
from service.backends.torch_backend import TorchBackend

# Families whose layers are BERT's (attention.self.{query,key,value}, attention.output,
# intermediate, output) and those counting positions from padding_idx + 1.
_BERT_LAYERS = frozenset({"bert", "roberta", "xlm-roberta"})
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "mpnet"})
_FAMILIES = _BERT_LAYERS | {"mpnet"}
_SUFFIXES = ("Model", "ForSequenceClassification", "ForMaskedLM")


def unsupported(model: Any) -> str | None:
    """Why `model` cannot run packed, in a few words; None when it can."""
    config = model.config
    family = str(getattr(config, "model_type", ""))
    if family not in _FAMILIES:
        return f"model type {family or 'unknown'} runs padded (packed: BERT, RoBERTa, XLM-R, MPNet)"
    name = type(model).__name__
    if not any(name.endswith(s) for s in _SUFFIXES):
        return f"{name} runs padded (packed: the bare encoder, sequence classifiers, masked LM)"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder configuration runs padded"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return "relative position embeddings run padded"
    return None


class PackedForward:
    """`model`'s first output computed packed (see the module). Call under inference mode.

    Raises `ValueError` from the constructor for a model `unsupported` names."""

    def __init__(self, model: Any) -> None:
        why = unsupported(model)
        if why is not None:
            raise ValueError(why)
        self.model = model
        self.base = model.base_model
        self.family = str(model.config.model_type)
        name = type(model).__name__
        self.head = (
            "classifier"
            if name.endswith("ForSequenceClassification")
            else "masked-lm"
            if name.endswith("ForMaskedLM")
            else "rows"
        )

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        """`inputs`: the padded int64 batch (`input_ids`, `attention_mask`, optionally
        `token_type_ids`, each [B, L]). Returns the model's first output, in its dtype:
        [B, L, H] token rows, [B, L, vocab] masked-LM logits (zeros at padding), or
        [B, labels] logits."""
        packing = Packing.of(inputs["attention_mask"])
        x = self._embed(inputs, packing)
        layers = self.base.encoder.layer
        if self.family == "mpnet":
            bias = self.base.encoder.compute_position_bias(inputs["attention_mask"][:1])
            for layer in layers:
                x = _mpnet_layer(layer, x, packing, bias)
        else:
            for layer in layers:
                x = _bert_layer(layer, x, packing)
        if self.head == "classifier":
            return self._classify(x, inputs["attention_mask"])
        if self.head == "masked-lm":
            head = self.model.cls if self.family == "bert" else self.model.lm_head
            x = head(x)
        return packing.unpack(x)

    def _embed(self, inputs: Mapping[str, Any], packing: Packing) -> Any:
        """The embeddings module on the packed tokens: [T, H]."""
        import torch

        ids = inputs["input_ids"]
        embeddings = self.base.embeddings
        if self.family in _OFFSET_POSITIONS:
            pad = int(embeddings.padding_idx)
            real = ids.ne(pad).long()
            positions = torch.cumsum(real, dim=1) * real + pad
        else:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        packed_ids = packing.pack(ids)[None]
        kwargs: dict[str, Any] = {
            "input_ids": packed_ids,
            "position_ids": packing.pack(positions)[None],
        }
        if self.family != "mpnet":
            types = inputs.get("token_type_ids")
            kwargs["token_type_ids"] = (
                torch.zeros_like(packed_ids) if types is None else packing.pack(types)[None]
            )
        return embeddings(**kwargs)[0]

    def _classify(self, x: Any, attention_mask: Any) -> Any:
        """The classifier head on each sequence's first real token ([CLS] / <s>): [B, labels]."""
        import torch

        lengths = attention_mask.sum(dim=1)
        first = torch.cumsum(lengths, dim=0) - lengths
        cls = x.index_select(0, first)[:, None, :]  # [B, 1, H]: the heads read position 0
        if self.family == "bert":
            return self.model.classifier(self.model.dropout(self.base.pooler(cls)))
        return self.model.classifier(cls)


def _bert_layer(layer: Any, x: Any, packing: Packing) -> Any:
    """One BERT/RoBERTa/XLM-R encoder layer on packed rows [T, H] (post-layer-norm)."""
    attention = layer.attention.self
    context = packing.attend(
        attention.query(x),
        attention.key(x),
        attention.value(x),
        heads=int(attention.num_attention_heads),
        scale=float(attention.scaling),
    )
    x = layer.attention.output(context, x)
    return layer.output(layer.intermediate(x), x)


def _mpnet_layer(layer: Any, x: Any, packing: Packing, bias: Any) -> Any:
    """One MPNet encoder layer on packed rows [T, H]; `bias`: its relative-position bias
    [1, heads, L, L] (`MPNetEncoder.compute_position_bias`)."""
    attention = layer.attention.attn
    context = packing.attend(
        attention.q(x),
        attention.k(x),
        attention.v(x),
        heads=int(attention.num_attention_heads),
        scale=float(attention.attention_head_size) ** -0.5,
        bias=bias,
    )
    x = layer.attention.LayerNorm(attention.o(context) + x)
    return layer.output(layer.intermediate(x), x)


class PackedTorchBackend(TorchBackend):
    """`TorchBackend` computing packed (`PackedForward`); same inputs and outputs."""

    compute = "packed"

    def __init__(self, model: Any, device: Any) -> None:
        super().__init__(model, device)
        self._packed: Callable[[Mapping[str, Any]], Any] = PackedForward(model)

    def forward(self, inputs: Mapping[str, Any]) -> Any:
        import torch

        with torch.inference_mode():
            out = self._packed({k: v.to(self.device) for k, v in inputs.items()})
        return out.float().cpu()


def torch_backend(model: Any, device: Any) -> TorchBackend:
    """The packed backend where `model` supports it, else the padded `TorchBackend`."""
    why = unsupported(model)
    if why is None:
        return PackedTorchBackend(model, device)
    padded = TorchBackend(model, device)
    padded.padded_because = why
    return padded
