"""The one internal job type every protocol parses into: units of model work, and a finish.

A protocol adapter (`service.protocols.*`) turns its wire shape into a `Job`: the `Unit`s the
inference thread computes (one per model input: a text, a text pair, or token ids) and a
`finish` that turns their answers, in order, into the response content. Admission, deadlines,
shedding, cancellation and the batcher see only units, so every route behaves the same.

Ops and the answer each unit gets (`service.engine.forward.encoder` /
`service.engine.forward.pipeline` compute them):

| op | input | answer |
| --- | --- | --- |
| `embed` | text (or ids) | float32 [D]: the pooled sentence embedding |
| `rows` | text (or ids) | float32 [tokens, H]: the last hidden state, one row per token |
| `logits` | text or pair | float32 [labels]: the classifier's raw logits |
| `classify` | text or pair | the text-classification pipeline's answer: [{label, score}] |
| `pipeline` | text | the pipeline's own answer (fill-mask, token-classification) |
| `tokenize` | text | [{id, text, special, start, stop}]: no forward |
| `decode` | ids | str: no forward |
| `sparse` | text (or ids) | `pooling.sparse.SparseVector`: a SPLADE model's non-zero weights |
| `multi_vector` | text | float32 [tokens, D]: a multi-vector model's kept token vectors |
| `hybrid` | text (or ids) | BGE-M3: a dict of the `outputs` asked (dense, sparse, multi_vector) |

A unit's `params` are its options, one frozen type per kind of work
(`service.engine.params`). A unit whose params set `count_tokens` gets its answer as
`Counted(answer, tokens)`: the tokens its input took (after truncation, prompt and special
tokens included), for usage counts; the event loop never tokenizes. An `embed` unit whose
params set `ranges` gets `Ranged(vector, ranges)`: its vector and the int8/uint8
quantization ranges of its width and normalization (`service.engine.loading.quantization`),
so the event loop never computes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from service.engine.params import (
    EmbedParams,
    MultiVectorParams,
    PairParams,
    PipelineParams,
    TextParams,
    TokenParams,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class Op(StrEnum):
    EMBED = "embed"
    ROWS = "rows"
    LOGITS = "logits"
    CLASSIFY = "classify"
    PIPELINE = "pipeline"
    TOKENIZE = "tokenize"
    DECODE = "decode"
    SPARSE = "sparse"
    MULTI_VECTOR = "multi_vector"
    HYBRID = "hybrid"


#: Ops answered in the inference thread without a forward pass (they never enter a batch).
NO_FORWARD = frozenset({Op.TOKENIZE, Op.DECODE})

#: The options type each op reads.
PARAMS: dict[Op, type[TextParams]] = {
    Op.EMBED: EmbedParams,
    Op.ROWS: EmbedParams,
    Op.SPARSE: EmbedParams,
    Op.LOGITS: PairParams,
    Op.CLASSIFY: PairParams,
    Op.PIPELINE: PipelineParams,
    Op.TOKENIZE: TokenParams,
    Op.DECODE: TokenParams,
    Op.MULTI_VECTOR: MultiVectorParams,
    Op.HYBRID: EmbedParams,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One model input. Exactly one of `text` and `ids` is set; `pair` only with `text`.
    `params` are its options, of the type its op reads (`PARAMS`; its defaults where None).
    Raises TypeError for options of another type."""

    op: Op
    text: str | None = None
    pair: str | None = None
    ids: tuple[int, ...] | None = None
    params: TextParams = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        kind = PARAMS[self.op]
        if self.params is None:
            object.__setattr__(self, "params", kind())
        elif not isinstance(self.params, kind):
            raise TypeError(f"{self.op} reads {kind.__name__}, not {type(self.params).__name__}")


@dataclass(frozen=True, slots=True)
class Counted:
    """An answer and the number of tokens its input took (units with `count_tokens`)."""

    answer: Any
    tokens: int


@dataclass(frozen=True, slots=True)
class Ranged:
    """An embedding (float32 [D]) and the quantization ranges of vectors like it (float32
    [2, D]: each dimension's minimum and maximum over the calibration set), for units with
    `ranges`."""

    vector: npt.NDArray[np.float32]
    ranges: npt.NDArray[np.float32]


def _identity(answers: list[object]) -> list[object]:
    return answers


@dataclass(frozen=True, slots=True)
class Job:
    """What one request asks: its units and how their answers become the response content.

    `paths` name each unit's input for error messages (`inputs[2]`, `texts[0]`); None when
    the request holds one input (its errors need no path)."""

    units: Sequence[Unit]
    finish: Callable[[list[Any]], object] = _identity
    paths: Sequence[str] | None = None
    headers: Mapping[str, str] | None = None  # extra response headers (e.g. `Warning`)

    @property
    def inputs(self) -> int:
        """Units count against MAX_QUEUE_SIZE and in the logs' and metrics' `inputs`."""
        return len(self.units)
