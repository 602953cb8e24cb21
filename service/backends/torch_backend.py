"""The transformers model itself: float32, or a bfloat16/float16 copy of it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class TorchBackend:
    """`model(**inputs)[0]` on `device`, under `torch.inference_mode`, as float32 on the CPU."""

    name = "torch"
    compute = "padded"  # every batch padded to its longest input (`service.backends.packed`)
    padded_because: str | None = None  # why it is not packed, for /info

    def __init__(self, model: Any, device: Any) -> None:
        self.model = model
        self.device = device
        self.dtype = str(model.dtype).removeprefix("torch.")

    def forward(self, inputs: Mapping[str, Any]) -> Any:
        import torch

        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
        return out[0].float().cpu()


def converted(model: Any, dtype: str) -> Any:
    """A copy of `model` in `dtype` ("bfloat16", "float16"); the float32 original is kept as
    the reference the copy is checked against. Raises what `torch.nn.Module.to` raises."""
    import torch

    return copy.deepcopy(model).to(getattr(torch, dtype)).eval()
