"""OpenVINO on an exported ONNX graph (CPU): what serves DTYPE=int8's static int8 graph.

OpenVINO reads the quantize/dequantize pairs of the QDQ graph (`service.backends.int8`) as
int8 operations and runs the quantized MatMuls on the CPU's int8 dot products (VNNI, AMX);
what the graph keeps float runs at OpenVINO's default inference precision for the CPU
(bfloat16 where the CPU has it, else float32). How fast each runs
the same graph against torch bfloat16 is in docs/backends.md (int8).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from service.backends.onnx_backend import graph_feed

if TYPE_CHECKING:
    import torch


def compile_config(threads: int) -> dict[str, int | str]:
    """`threads` inference threads (the torch thread count: the container's CPU quota), one
    stream (one inference thread runs one batch at a time), latency mode."""
    return {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}


class OpenVinoBackend:
    """An OpenVINO model compiled for the CPU from `path` (an ONNX graph with dynamic batch
    and length), fed the inputs its graph names (others dropped; a missing `token_type_ids`
    as zeros). `forward` returns its first output as a float32 tensor."""

    name = "openvino"
    compute = "padded"
    padded_because = "the exported graph takes padded [B, L] inputs (docs/backends.md)"
    quantization: dict[str, object] | None = None  # int8: the recipe (/info's `quantization`)

    def __init__(self, path: Path, threads: int, dtype: str = "int8") -> None:
        import openvino

        self.path = path
        self.dtype = dtype
        core = openvino.Core()
        self.compiled = core.compile_model(
            core.read_model(str(path)), "CPU", compile_config(threads)
        )
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]
        self._request = self.compiled.create_infer_request()

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        output = self._request.infer(graph_feed(inputs, self.input_names))[0]
        return torch.from_numpy(output.copy()).float()  # the request's buffer is reused
