"""The transformers model itself: float32, or a bfloat16/float16 copy of it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


class TorchBackend:
    """`model(**inputs)[0]` on `device`, under `torch.inference_mode`, as float32 on the CPU."""

    name = "torch"
    compute = "padded"  # every batch padded to its longest input (`service.backends.packed`)
    padded_because: str | None = None  # why it is not packed, for /info

    # batches of at most this many padded tokens run on one intra-op thread (set at start by
    # `service.backends.threads.fit_one_thread`; 0: every batch on all of them)
    one_thread_up_to = 0

    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.dtype = str(model.dtype).removeprefix("torch.")

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if int(inputs["input_ids"].numel()) > self.one_thread_up_to:
            return self.forward_all_threads(inputs)
        return self.forward_on(inputs, 1)  # wakes no other thread (`service.backends.threads`)

    def all_threads(self) -> int:
        import torch

        return int(torch.get_num_threads())

    def forward_on(self, inputs: Mapping[str, torch.Tensor], threads: int) -> torch.Tensor:
        """`forward_all_threads` with torch's intra-op threads at `threads`."""
        from service.backends.threads import threads_set

        with threads_set(threads):
            return self.forward_all_threads(inputs)

    def release_one_thread(self) -> None:
        """Nothing: one thread is `torch.set_num_threads(1)`, no copy of anything."""

    def forward_all_threads(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`forward` on torch's threads as set."""
        import torch

        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
        return out[0].float().cpu()


def converted(model: PreTrainedModel, dtype: str) -> PreTrainedModel:
    """A copy of `model` in `dtype` ("bfloat16", "float16"); the float32 original is kept as
    the reference the copy is checked against. Raises what `torch.nn.Module.to` raises."""
    import torch

    return copy.deepcopy(model).to(getattr(torch, dtype)).eval()
