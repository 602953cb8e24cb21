"""Output encodings of embeddings: what vector databases store (`encoding_format`, Cohere's
`embedding_types`).

| format | one vector as | equal to |
| --- | --- | --- |
| `float` | JSON numbers (float32's shortest form) | `encode()` |
| `base64` | base64 of the float32 little-endian bytes | OpenAI's, Cohere's (SDKs decode it) |
| `int8` | D numbers in -128..127 | `quantize_embeddings(x, "int8", ranges=r)` |
| `uint8` | D numbers in 0..255 (int8 + 128) | `quantize_embeddings(x, "uint8", ranges=r)` |
| `binary` | int8 numbers, a byte per 8 dimensions | `quantize_embeddings(x, "binary")` |
| `ubinary` | uint8 numbers, a byte per 8 dimensions | `quantize_embeddings(x, "ubinary")` |

int8/uint8 is sentence-transformers' scalar quantization (its `util.quantize_embeddings`):
bucket = floor((x - min) / ((max - min) / 255)), clipped to 0..255 (a value outside the range
gets the end bucket), a zero-width range's step 1; uint8 is the bucket, int8 the bucket - 128.
The ranges `r` ([2, D]: min, max per dimension) come from the server's calibration set, never
from the request (`service.engine.loading.quantization`): a text gets the same codes alone or among
others. Bits are packed big-endian within each byte (numpy's `packbits`, as sentence-transformers
packs them); a width that is not a multiple of 8 is padded with zero bits. `binary`'s `- 128`
wraps in uint8 before the int8 cast, exactly as `quantize_embeddings` computes it, so answers
equal it bit for bit.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from service.engine.jobs import Ranged
from service.protocols.schemas import DENSE_ONLY

Encoding = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]
ENCODINGS: tuple[Encoding, ...] = ("float", "base64", "int8", "uint8", "binary", "ubinary")
#: The encodings that need calibrated ranges (the unit param `ranges`).
SCALAR: frozenset[str] = frozenset({"int8", "uint8"})

#: `encoding_format` of a request model: int8/uint8 only where the model has dense embeddings
#: (the OpenAPI document of a sparse model leaves them out).
EncodingField = (
    Literal["float", "base64", "binary", "ubinary"]
    | Annotated[Literal["int8", "uint8"], Field(json_schema_extra={DENSE_ONLY: True})]
)


def needs_ranges(encodings: Any) -> bool:
    """Whether any of `encodings` (one, or several) is int8/uint8."""
    if encodings is None:
        return False
    chosen = encodings if isinstance(encodings, (list, tuple, set, frozenset)) else [encodings]
    return any(e in SCALAR for e in chosen)


def encode_vector(answer: Any, encoding: str | None) -> Any:
    """One embedding in `encoding` (None: float): an array of floats, a base64 string, an
    int8/uint8 array of D codes, or an int8/uint8 array of ceil(D / 8) packed bytes.

    `answer` is a float32 [D] vector, or a `Ranged` (the vector and its ranges), which int8
    and uint8 need."""
    vector = answer.vector if isinstance(answer, Ranged) else answer
    if encoding is None or encoding == "float":
        return vector
    x = np.asarray(vector, dtype=np.float32)
    if encoding == "base64":
        return base64.b64encode(x.astype("<f4").tobytes()).decode("ascii")
    if encoding in SCALAR:
        if not isinstance(answer, Ranged):
            raise TypeError(f"{encoding} needs the vector's ranges (a unit with `ranges`)")
        buckets = scalar_buckets(x, answer.ranges)
        return buckets.astype(np.uint8) if encoding == "uint8" else (buckets - 128).astype(np.int8)
    packed = np.packbits(x > 0, axis=-1)
    if encoding == "ubinary":
        return packed
    return (packed - 128).astype(np.int8)  # quantize_embeddings' own expression


def scalar_buckets(x: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """float32 buckets 0..255 of `x` [..., D] for `ranges` [2, D], as `quantize_embeddings`
    computes them (its float32 arithmetic, in its order)."""
    starts = ranges[0].astype(np.float32)
    steps = (ranges[1].astype(np.float32) - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets: np.ndarray = np.clip(np.floor((x - starts) / steps), 0, 255)
    return buckets


def encode_all(vectors: list[Any], encoding: str | None) -> list[Any]:
    """`encode_vector` on each vector, in order."""
    return [encode_vector(v, encoding) for v in vectors]
