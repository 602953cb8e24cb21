"""Padding-free (packed) forward of BERT-family encoders on torch, with the model's own modules.

A padded batch computes B x L tokens, of which only T are real; on the benchmark's short corpus
batches of 32 in arrival order compute 1.86 tokens per real token. Packed, the batch's real
tokens are concatenated into one [T, H] matrix and every token-wise part of the encoder runs on
it: the embeddings (word, position and token-type lookups and their layer norm), the query,
key, value and output projections (query, key and value as one product: `_fused_qkv`), the
feed-forward layers and the layer norms, more than 90% of the FLOPs at these lengths. Only
attention sees the sequences apart (`service.backends.packing.Packing.attend`: a padded SDPA
with a key mask over the packed rows). The output is scattered back to the padded shape the
engine expects ([B, L, H] token rows or [B, L, vocab] masked-LM logits, zeros at padding) or
is a classifier's [B, labels].

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
from typing import TYPE_CHECKING

from service.backends.packing import Packing, tokens_up_to
from service.backends.torch_backend import TorchBackend

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from service.backends import Backend

# Families whose layers are BERT's (attention.self.{query,key,value}, attention.output,
# intermediate, output) and those counting positions from padding_idx + 1.
_BERT_LAYERS = frozenset({"bert", "roberta", "xlm-roberta"})
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "mpnet"})
_FAMILIES = _BERT_LAYERS | {"mpnet"}
_SUFFIXES = ("Model", "ForSequenceClassification", "ForMaskedLM")


def unsupported(model: PreTrainedModel) -> str | None:
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

    `buckets` (default: in bfloat16 and float16, where oneDNN compiles a kernel per shape)
    rounds the batch's shapes up to a fixed set (`service.backends.packing`); float32's matrix
    products compile nothing per shape (one GELU kernel a new T), so padding would not pay.
    Raises `ValueError` from the constructor for a model `unsupported` names."""

    def __init__(self, model: PreTrainedModel, buckets: bool | None = None) -> None:
        import torch

        why = unsupported(model)
        if why is not None:
            raise ValueError(why)
        self.model = model
        self.buckets = model.dtype != torch.float32 if buckets is None else buckets
        self.base = model.base_model
        self.family = str(model.config.model_type)
        self.qkv = [_fused_qkv(layer, self.family) for layer in self.base.encoder.layer]
        name = type(model).__name__
        self.head = (
            "classifier"
            if name.endswith("ForSequenceClassification")
            else "masked-lm"
            if name.endswith("ForMaskedLM")
            else "rows"
        )

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`inputs`: the padded int64 batch (`input_ids`, `attention_mask`, optionally
        `token_type_ids`, each [B, L]). Returns the model's first output, in its dtype:
        [B, L, H] token rows, [B, L, vocab] masked-LM logits (zeros at padding), or
        [B, labels] logits."""
        packing = Packing.of(inputs["attention_mask"], self.buckets)
        x = self._embed(inputs, packing)
        layers = zip(self.base.encoder.layer, self.qkv, strict=True)
        if self.family == "mpnet":
            bias = self.base.encoder.compute_position_bias(inputs["attention_mask"][:1])
            for layer, qkv in layers:
                x = _mpnet_layer(layer, qkv, x, packing, bias)
        else:
            for layer, qkv in layers:
                x = _bert_layer(layer, qkv, x, packing)
        if self.head == "classifier":
            return self._classify(x, inputs["attention_mask"])
        if self.head == "masked-lm":
            head = self.model.cls if self.family == "bert" else self.model.lm_head
            x = head(x)
        return packing.unpack(x)

    def warm(self, max_tokens: int, max_batch: int, max_width: int) -> int:
        """Make every bucket's kernels (see `service.backends.packing`) for batches of up to
        `max_tokens` real tokens and `max_batch` inputs of up to `max_width` tokens, so that
        no batch compiles one: one layer's token-wise parts on each token bucket's rows (every
        layer has the same shapes) and a classifier's head on each batch size. Returns the
        shapes run; 0 without buckets. Call under inference mode."""
        import torch

        if not self.buckets:
            return 0
        layer, qkv = self.base.encoder.layer[0], self.qkv[0]
        hidden = int(qkv[0].shape[1])
        attention = layer.attention.attn if self.family == "mpnet" else layer.attention.self
        weight = qkv[0]
        runs = 0
        for size in tokens_up_to(max_tokens):
            x = weight.new_zeros(size, hidden)
            mixed = torch.nn.functional.linear(x, *qkv)
            context = mixed[:, :hidden].contiguous()
            if self.family == "mpnet":
                x = layer.attention.LayerNorm(attention.o(context) + x)
            else:
                x = layer.attention.output(context, x)
            layer.output(layer.intermediate(x), x)
            runs += 1
        if self.head == "classifier":
            for batch in range(1, max_batch + 1):
                self._classify(weight.new_zeros(batch, hidden), torch.ones(batch, 1).long())
                runs += 1
        return runs

    def _embed(self, inputs: Mapping[str, torch.Tensor], packing: Packing) -> torch.Tensor:
        """The embeddings module on the packed tokens: [size, H]."""
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
        kwargs: dict[str, torch.Tensor] = {
            "input_ids": packed_ids,
            "position_ids": packing.pack(positions)[None],
        }
        if self.family != "mpnet":
            types = inputs.get("token_type_ids")
            kwargs["token_type_ids"] = (
                torch.zeros_like(packed_ids) if types is None else packing.pack(types)[None]
            )
        return embeddings(**kwargs)[0]

    def _classify(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The classifier head on each sequence's first real token ([CLS] / <s>): [B, labels]."""
        import torch

        lengths = attention_mask.sum(dim=1)
        first = torch.cumsum(lengths, dim=0) - lengths
        cls = x.index_select(0, first)[:, None, :]  # [B, 1, H]: the heads read position 0
        if self.family == "bert":
            return self.model.classifier(self.model.dropout(self.base.pooler(cls)))
        return self.model.classifier(cls)


def _fused_qkv(layer: torch.nn.Module, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's query, key and value projections as one: weight [3 x H, H] and bias
    [3 x H] (their outputs side by side, as `Packing.attend` reads them): one matrix product
    instead of three, and one gather per attention group. The three modules' own weights and
    biases become views of these, so the model keeps computing as before and its memory does
    not grow."""
    import torch

    attention = layer.attention.attn if family == "mpnet" else layer.attention.self
    names = ("q", "k", "v") if family == "mpnet" else ("query", "key", "value")
    linears = [getattr(attention, name) for name in names]
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat(
        [
            m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
            for m in linears
        ]
    )
    start = 0
    for m in linears:
        rows = slice(start, start + m.out_features)
        m.weight = torch.nn.Parameter(weight[rows], requires_grad=False)
        if m.bias is not None:
            m.bias = torch.nn.Parameter(bias[rows], requires_grad=False)
        start = rows.stop
    return weight, bias


def _bert_layer(
    layer: torch.nn.Module,
    qkv: tuple[torch.Tensor, torch.Tensor],
    x: torch.Tensor,
    packing: Packing,
) -> torch.Tensor:
    """One BERT/RoBERTa/XLM-R encoder layer on packed rows [T, H] (post-layer-norm); `qkv`:
    its fused projection (`_fused_qkv`)."""
    import torch.nn.functional as F

    attention = layer.attention.self
    context = packing.attend(
        F.linear(x, *qkv),
        heads=int(attention.num_attention_heads),
        scale=float(attention.scaling),
    )
    x = layer.attention.output(context, x)
    return layer.output(layer.intermediate(x), x)


def _mpnet_layer(
    layer: torch.nn.Module,
    qkv: tuple[torch.Tensor, torch.Tensor],
    x: torch.Tensor,
    packing: Packing,
    bias: torch.Tensor,
) -> torch.Tensor:
    """One MPNet encoder layer on packed rows [T, H]; `qkv`: its fused projection; `bias`: its
    relative-position bias [1, heads, L, L] (`MPNetEncoder.compute_position_bias`)."""
    import torch.nn.functional as F

    attention = layer.attention.attn
    context = packing.attend(
        F.linear(x, *qkv),
        heads=int(attention.num_attention_heads),
        scale=float(attention.attention_head_size) ** -0.5,
        bias=bias,
    )
    x = layer.attention.LayerNorm(attention.o(context) + x)
    return layer.output(layer.intermediate(x), x)


class PackedTorchBackend(TorchBackend):
    """`TorchBackend` computing packed (`PackedForward`); same inputs and outputs."""

    compute = "packed"

    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        super().__init__(model, device)
        self.packed = PackedForward(model)
        self._packed: Callable[[Mapping[str, torch.Tensor]], torch.Tensor] = self.packed

    def forward_all_threads(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            out = self._packed({k: v.to(self.device) for k, v in inputs.items()})
        return out.float().cpu()


def warm_kernels(backend: Backend, max_tokens: int, max_batch: int, max_width: int) -> int:
    """`PackedForward.warm` for a packed torch backend (or the packed half of a routed one);
    returns the shapes run, 0 for every other backend."""
    import torch

    for part in (backend, getattr(backend, "large", None), getattr(backend, "small", None)):
        if isinstance(part, PackedTorchBackend) and str(part.device) == "cpu":
            with torch.inference_mode():
                return part.packed.warm(max_tokens, max_batch, max_width)
    return 0


def torch_backend(model: PreTrainedModel, device: torch.device) -> TorchBackend:
    """The packed backend where `model` supports it, else the padded `TorchBackend`."""
    why = unsupported(model)
    if why is None:
        return PackedTorchBackend(model, device)
    padded = TorchBackend(model, device)
    padded.padded_because = why
    return padded
