"""Output encodings of embeddings: what vector databases store (`encoding_format`).

| format | one vector as | equal to |
| --- | --- | --- |
| `float` | JSON numbers (float32's shortest form) | `encode()` |
| `base64` | base64 of the float32 little-endian bytes | OpenAI's (the SDK decodes it) |
| `binary` | int8 numbers, a byte per 8 dimensions | `quantize_embeddings(x, "binary")` |
| `ubinary` | uint8 numbers, a byte per 8 dimensions | `quantize_embeddings(x, "ubinary")` |

Bits are packed big-endian within each byte (numpy's `packbits`, as sentence-transformers
packs them); a width that is not a multiple of 8 is padded with zero bits. `binary`'s `- 128`
wraps in uint8 before the int8 cast, exactly as `quantize_embeddings` computes it, so answers
equal it bit for bit. int8/uint8 scalar quantization is not offered: it needs per-dimension
ranges from a calibration set that a server does not have (`quantize_embeddings` would
calibrate on the request's own vectors, so one text's answer would depend on its neighbours).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np

Encoding = Literal["float", "base64", "binary", "ubinary"]
ENCODINGS: tuple[Encoding, ...] = ("float", "base64", "binary", "ubinary")


def encode_vector(vector: Any, encoding: Encoding | None) -> Any:
    """One float32 [D] vector in `encoding` (None: float): an array of floats, a base64 string,
    or an int8/uint8 array of ceil(D / 8) packed bytes."""
    if encoding is None or encoding == "float":
        return vector
    x = np.asarray(vector, dtype=np.float32)
    if encoding == "base64":
        return base64.b64encode(x.astype("<f4").tobytes()).decode("ascii")
    packed = np.packbits(x > 0, axis=-1)
    if encoding == "ubinary":
        return packed
    return (packed - 128).astype(np.int8)  # quantize_embeddings' own expression


def encode_all(vectors: list[Any], encoding: Encoding | None) -> list[Any]:
    """`encode_vector` on each vector, in order."""
    return [encode_vector(v, encoding) for v in vectors]
