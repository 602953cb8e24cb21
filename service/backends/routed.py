"""Two backends behind one: small batches on one, large batches on the other.

Which backend is fastest depends on the batch's shape: a single short input costs mostly the
fixed price of running every operator once (where onnxruntime's fused graph is cheaper), a
large batch costs per token (where bfloat16 matrix units are faster; docs/backends.md has the
figures). The choice of which two and where they cross is
`service.engine.loading.choice.ranking.route`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from service.backends import Backend

if TYPE_CHECKING:
    import torch


class RoutedBackend:
    """`small.forward` for batches of at most `max_tokens` padded tokens (B x L), else
    `large.forward`. Its name, dtype and compute are `large`'s: the one that computes under
    load."""

    def __init__(self, small: Backend, large: Backend, max_tokens: int) -> None:
        self.small, self.large, self.max_tokens = small, large, max_tokens
        self.name, self.dtype, self.compute = large.name, large.dtype, large.compute
        # batches of at most this many padded tokens run padded though `large` packs
        self.padded_up_to = max_tokens if small.compute == "padded" else 0

    def backend_for(self, padded_tokens: int) -> Backend:
        return self.small if padded_tokens <= self.max_tokens else self.large

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.backend_for(int(inputs["input_ids"].numel())).forward(inputs)
