"""A unit's options, one frozen type per kind of work, built where each request is parsed
(`service.protocols.*`) and read by attribute in the engine. The defaults here are the only
ones: a reader never restates them.

| type | ops | read by |
| --- | --- | --- |
| `TextParams` | every op with a text | `forward.tokenizing` (and the other engines' tokenizing) |
| `EmbedParams` | `embed`, `rows`, `sparse`, `hybrid` | `pooling.outputs`, `forward.windows` |
| `PairParams` | `logits`, `classify` | `forward.encoder`, `llm_rerank.engine` |
| `TokenParams` | `tokenize`, `decode` | `forward.tokenizing` |
| `MultiVectorParams` | `multi_vector` | `multi_vector.engine` |
| `PipelineParams` | `pipeline` | `forward.pipeline` |

A new request option is one field here, one line where its request is parsed, and its reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Side = Literal["right", "left"]  # which end of a text truncation cuts


@dataclass(frozen=True, slots=True, kw_only=True)
class TextParams:
    """How a unit's text becomes token ids, and what its answer carries beside itself."""

    # Cut an input over its limit (the model's, or `max_tokens`) at that limit; else 422.
    truncate: bool = False
    # An `embed` text over the model's limit is embedded in windows whose pooled vectors are
    # averaged (`service.engine.forward.windows`) instead of refused (LONG_INPUTS=chunk).
    chunk: bool = False
    # Which end truncation cuts.
    direction: Side = "right"
    # How a pair is cut: "only_first" never cuts its second text (zero-shot hypotheses).
    strategy: Literal["longest_first", "only_first"] = "longest_first"
    # A lower limit than the model's, in the input's own tokens with its prompt (special
    # tokens not counted): Cohere's `max_tokens`.
    max_tokens: int | None = None
    # The pair's second text cut to its first N tokens before the pair is encoded (Cohere's
    # `max_tokens_per_doc`).
    pair_max_tokens: int | None = None
    # A key of the model's sentence-transformers `prompts`; "" for no prompt even where the
    # model has a default one; None for the model's default.
    prompt_name: str | None = None
    # Answer `Counted(answer, tokens)`: the tokens the input took, for usage counts.
    count_tokens: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbedParams(TextParams):
    """A pooled embedding's (or a SPLADE vector's, or token rows') options."""

    # L2-normalize the vector (after `dimensions`); the model's own Normalize module decides
    # where a request does not say (the protocols resolve that).
    normalize: bool = True
    # Keep the first N dimensions (Matryoshka), then normalize.
    dimensions: int | None = None
    # Answer `Ranged(vector, ranges)`: the int8/uint8 quantization ranges of this width and
    # normalization, so the event loop never computes them.
    ranges: bool = False
    # A SPLADE vector's largest N weights only.
    max_active_dims: int | None = None
    # A `hybrid` unit (a BGE-M3 model): which of its outputs its answer holds, of "dense",
    # "sparse" and "multi_vector", all made from one forward.
    outputs: tuple[Literal["dense", "sparse", "multi_vector"], ...] = ("dense",)
    # Late chunking: the text is one document's chunks joined with single spaces, and these
    # are the chunks' character spans in it ([start, end), in order). The answer is one vector
    # per chunk, float32 [chunks, D], each the mean of its own tokens' rows of the document's
    # last hidden state (`service.engine.forward.late`). None: an ordinary embedding.
    late_chunks: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PairParams(TextParams):
    """A classifier's or reranker's options (a text, or a text pair)."""

    # `classify`: the text-classification pipeline's `function_to_apply` (None: its default);
    # a causal-LM reranker's score function ("sigmoid" where None).
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None
    # `classify`: the labels answered, highest first (None: every label).
    top_k: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenParams(TextParams):
    """TEI's `/tokenize` and `/decode` options."""

    add_special_tokens: bool = True
    skip_special_tokens: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiVectorParams(TextParams):
    """A multi-vector (late-interaction) model's options."""

    # Queries and documents get their own prompt, length and (queries) expansion.
    input_type: Literal["query", "document"] = "document"
    # Token pooling (`multi_vector.token_pooling`): about 1/pool_factor of a document's token
    # vectors kept, similar ones merged (>= 1, fractional allowed; 1: none). None: the folder's
    # own HierarchicalTokenPooling, if it ships one.
    pool_factor: float | None = None
    # The leading token vectors token pooling never merges (sentence-transformers'
    # `num_protected_tokens`, PyLate's `protected_tokens`). None: the folder's, else 1.
    protected_tokens: int | None = None
    # The text cut to its first N tokens (prompt and special tokens not counted) before it is
    # encoded: Cohere's `max_tokens_per_doc` on a multi-vector model.
    max_tokens_per_doc: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams(TextParams):
    """A transformers pipeline's (fill-mask, token-classification) validated task arguments
    (`service.protocols.params`), as (name, value) pairs sorted by name, lists as tuples, so
    that the set is hashable: the pipeline engine caches its calls by it. `truncate` is the
    pipeline's `truncation`, resolved by the protocol."""

    arguments: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, arguments: dict[str, Any], *, truncate: bool) -> PipelineParams:
        """From the task's arguments that were set (`Params.model_dump(exclude_none=True)`)."""

        def frozen(v: Any) -> Any:
            return tuple(v) if isinstance(v, list) else v

        items = tuple(sorted((k, frozen(v)) for k, v in arguments.items()))
        return cls(arguments=items, truncate=truncate)


P = TypeVar("P", bound=TextParams)


def narrow(params: TextParams, kind: type[P]) -> P:
    """`params` as the `kind` its op reads (`service.engine.jobs.Unit` checks it when the unit
    is made). Raises TypeError for another kind: a unit built wrong, a bug."""
    if not isinstance(params, kind):
        raise TypeError(f"{type(params).__name__} where {kind.__name__} is read")
    return params
