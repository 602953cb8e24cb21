"""How a sentence-transformers model turns token rows into one sentence embedding
(`SentenceConfig`, read from its folder by `service.engine.loading.st_config`; computed by
`service.engine.pooling.pool`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.engine.folders import M3_HEADS
from service.engine.pooling.heads import DenseSpec
from service.engine.pooling.sparse import SpladeSpec

# ST 6 concatenates modes in the order `pooling_mode` lists them; legacy booleans in this order.
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


@dataclass(frozen=True, kw_only=True)
class SentenceConfig:
    """How a sentence-transformers model turns token rows into one sentence embedding."""

    modes: tuple[str, ...]  # pooling modes, concatenated in this order
    dimension: int  # output width: hidden size x len(modes)
    include_prompt: bool = True  # False: prompt tokens are left out of pooling
    normalize: bool = True  # L2-normalize (a Normalize module follows Pooling)
    max_seq_length: int | None = None  # sentence_bert_config.json; None: the tokenizer's
    do_lower_case: bool = False  # a Lowercase normalizer goes before the tokenizer's own
    prompts: dict[str, str] = field(default_factory=dict)  # with ST's "query" and "document"
    default_prompt_name: str | None = None
    transformer_path: str = ""  # the folder of the Transformer module, relative ("" = root)
    dense: tuple[DenseSpec, ...] = ()  # Dense modules after Pooling, in order
    splade: SpladeSpec | None = None  # a SparseEncoder: SPLADE pooling of MLM logits
    folder: str = ""  # the model folder the module paths are relative to
    declared_dimension: int | None = None  # what the Pooling config says (may be wrong)
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: not trained for cutting
    # A BGE-M3 folder (`service.engine.pooling.m3`): dense is its CLS vector, normalized;
    # sparse and multi-vector answers come from its two heads, off the same forward.
    m3: bool = False

    def modules(self) -> tuple[str, ...]:
        """The module chain for /info and logs, e.g. `("Transformer", "Pooling(mean)",
        "Dense(768->768, Tanh)", "Normalize")`."""
        if self.m3:
            return ("Transformer", "Pooling(cls)", "Normalize", *M3_HEADS)
        if self.splade is not None:
            s = self.splade
            return ("Transformer(fill-mask)", f"SpladePooling({s.strategy}, {s.activation})")
        out = ["Transformer", f"Pooling({'+'.join(self.modes)})"]
        for d in self.dense:
            act = d.activation.rsplit(".", 1)[-1]
            out.append(f"Dense({d.in_features}->{d.out_features}, {act})")
        return (*out, *(("Normalize",) if self.normalize else ()))
