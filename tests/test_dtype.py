"""DTYPE: int8 dynamic quantization and bfloat16 answer close to float32 (shape kept)."""

from __future__ import annotations

import numpy as np
import pytest

from service.jobs import Op, Unit
from service.loading import load_engine
from service.settings import Settings, SettingsError, load_settings

TEXTS = ["A man is playing a guitar.", "The stock market fell sharply today, analysts said."]


@pytest.mark.parametrize("dtype, min_cosine", [("int8", 0.8), ("bfloat16", 0.999)])
def test_reduced_precision_is_close_to_float32(dtype: str, min_cosine: float) -> None:
    def answers(d: str) -> list[np.ndarray]:
        engine = load_engine(Settings(dtype=d))  # type: ignore[arg-type]
        return list(engine.run([engine.prepare(Unit(op=Op.EMBED, text=t)) for t in TEXTS]))

    reference, reduced = answers("float32"), answers(dtype)
    for a, b in zip(reference, reduced, strict=True):  # normalized sentence embeddings
        assert a.shape == b.shape == (384,) and b.dtype == np.float32
        assert float(a @ b) > min_cosine


def test_int8_needs_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTYPE", "int8")
    monkeypatch.setenv("DEVICE", "cuda")
    with pytest.raises(SettingsError, match="DTYPE=int8"):
        load_settings()
