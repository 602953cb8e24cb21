"""int8/uint8 quantization ranges at run time: the calibration vectors of the loaded model and the
ranges made from them per (normalize, dimensions), as the engine finishes a unit's vector. The
vectors are made at start (`service.engine.loading.quantization`, which says how and why)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

PACKAGED = "calibration.txt"  # in service/data/


_KEPT = 256  # (normalize, dimensions) range sets kept; past it the oldest are dropped


@dataclass(frozen=True)
class CalibrationSet:
    """The calibration texts, where they come from ("packaged" or the file's path) and the
    SHA-256 of the texts joined by newlines (UTF-8)."""

    texts: tuple[str, ...]
    source: str
    sha256: str


def read_set(path: Path | str | None = None) -> CalibrationSet:
    """The texts of `path` (CALIBRATION_FILE), else the packaged set. Raises `ValueError` for a
    file with no text, `OSError` for one that cannot be read."""
    if path is None:
        raw = resources.files("service").joinpath("data", PACKAGED).read_text(encoding="utf-8")
    else:
        raw = Path(path).read_text(encoding="utf-8")
    lines = (line.strip() for line in raw.splitlines())
    texts = tuple(line for line in lines if line and not line.startswith("#"))
    if not texts:
        raise ValueError(f"CALIBRATION_FILE {path} holds no text (one text per line)")
    digest = hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()
    return CalibrationSet(texts, "packaged" if path is None else str(path), digest)


class Calibration:
    """The calibration vectors of the loaded model and the ranges made from them. Inference
    thread only (its cache is not locked)."""

    def __init__(self, vectors: np.ndarray, texts: CalibrationSet, seconds: float) -> None:
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # [N, D]
        self.texts = texts
        self.seconds = seconds
        self._ranges: dict[tuple[bool, int | None], np.ndarray] = {}

    @property
    def width(self) -> int:
        return int(self.vectors.shape[1])

    def ranges(self, normalize: bool, dimensions: int | None) -> np.ndarray:
        """float32 [2, dimensions or D]: each dimension's min and max over the calibration
        vectors cut to `dimensions` and then L2-normalized if `normalize` (eps 1e-12, as
        torch's `F.normalize`), i.e. as the engine finishes a unit's vector."""
        key = (normalize, dimensions)
        found = self._ranges.get(key)
        if found is None:
            x = self.vectors if dimensions is None else self.vectors[:, :dimensions]
            if normalize:
                x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
            found = np.stack([x.min(axis=0), x.max(axis=0)]).astype(np.float32)
            if len(self._ranges) >= _KEPT:
                self._ranges.pop(next(iter(self._ranges)))
            self._ranges[key] = found
        return found

    def summary(self) -> dict[str, Any]:
        """/info's `calibration`: the set's count, digest and source, and the seconds taken."""
        return {
            "texts": len(self.texts.texts),
            "sha256": self.texts.sha256,
            "source": self.texts.source,
            "seconds": round(self.seconds, 2),
        }
