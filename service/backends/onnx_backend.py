"""onnxruntime on an exported graph (CPU execution provider): float32."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch


def session_options(threads: int) -> ort.SessionOptions:
    """The session's options: `threads` intra-op threads (the torch thread count: the
    container's CPU quota), one inter-op thread (one inference thread runs one graph at a time;
    a second pool would only compete for the same cores), every graph optimization (fusions of
    attention, layer norm and GELU), sequential execution. The CPU memory arena is off: it
    keeps the largest block each batch shape asked for and never returns it, so serving every
    (batch, length) shape grows it without bound; with it off, blocks go back to the allocator
    after each run (memory patterns are per shape and off for the same reason). Its threads do
    not spin waiting for the next run: these cores are shared with the event loop and, when
    small batches run here and large ones on torch (`service.backends.routed`), with torch's
    threads: spinning threads would take their cores while the other runs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings are not our log lines
    return options


class OnnxBackend:
    """An onnxruntime session over `path`, fed the inputs its graph names (others dropped)."""

    name = "onnx"
    compute = "padded"
    padded_because = "the exported graph takes padded [B, L] inputs (docs/backends.md)"
    quantization: dict[str, object] | None = None  # not quantized (/info's `quantization`)

    def __init__(self, path: Path, threads: int, dtype: str = "float32") -> None:
        import onnxruntime as ort

        self.path = path
        self.dtype = dtype
        self.session = ort.InferenceSession(
            str(path), session_options(threads), providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._first_output = self.session.get_outputs()[0].name

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        (output,) = self.session.run([self._first_output], graph_feed(inputs, self.input_names))
        return torch.from_numpy(output).float()


def graph_feed(
    inputs: Mapping[str, torch.Tensor | np.ndarray], names: list[str]
) -> dict[str, np.ndarray]:
    """The numpy arrays an exported graph taking `names` is fed from the engine's `inputs`
    (tensors or arrays): the ones it names, others dropped; a name it takes that `inputs`
    lacks (token_type_ids, for a single text) as zeros shaped like `input_ids`."""

    def array(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
        return tensor.numpy() if hasattr(tensor, "numpy") else tensor

    return {
        name: array(inputs[name]) if name in inputs else array(inputs["input_ids"]) * 0
        for name in names
    }
