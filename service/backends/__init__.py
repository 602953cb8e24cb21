"""How a batch is computed: one small interface, one module per way of computing.

A backend knows tensors, not HTTP or jobs: `forward` takes the padded int64 inputs the engine
builds (`input_ids`, `attention_mask`, and `token_type_ids` where the model takes them, each
[B, L]) and returns the model's first output as a float32 CPU torch tensor: the last hidden
state [B, L, H] of an encoder, the logits [B, labels] of a classifier, the logits [B, L, vocab]
of a masked-LM model.

- `service.backends.torch_backend`: the transformers model in float32, bfloat16 or float16.
- `service.backends.packed`: the same, padding-free, for BERT-family encoders
  (`service.backends.packing`: where a batch's real tokens lie, attention over them).
- `service.backends.onnx_backend`: onnxruntime on an exported graph (float32).
- `service.backends.openvino_backend`: OpenVINO on the exported int8 graph (DTYPE=int8).
- `service.backends.export`: the ONNX export and its cache.
- `service.engine.loading.choice.ranking`: timing and checking candidates against torch float32 at
start.
- `service.engine.loading.choice.candidates`: which candidates BACKEND/DTYPE allow here, and the one
served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class Backend(Protocol):
    """One way of computing the model's first output. Inference thread only."""

    name: str  # "torch" or "onnx"
    dtype: str  # "float32", "bfloat16", "float16" or "int8"
    compute: str  # "packed" (real tokens only, `service.backends.packed`) or "padded"

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The model's first output for `inputs` (int64 CPU tensors [B, L] by input name) as a
        float32 CPU torch tensor ([B, L, H], [B, labels] or [B, L, vocab]); raises what the
        model raises."""
        ...
