"""onnxruntime on an exported graph (CPU execution provider): float32.

A session's intra-op threads are fixed when it is made, so a small batch on a session of two
threads always wakes the second. Where start-up timing says one thread costs less CPU and about
no more time for small batches (`service.backends.threads.fit_one_thread`), those run on a
second session made with one thread: it holds the weights again (about the graph's size in
RSS: docs/backends.md), so it is made only for graphs of at most `ONE_THREAD_MAX_GRAPH_BYTES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch

# The largest graph (file and external data) given a second, one-thread session, which costs
# about the graph's size again in RSS (docs/backends.md, small batches on one thread).
ONE_THREAD_MAX_GRAPH_BYTES = 512 << 20


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

    # batches of at most this many padded tokens run on the one-thread session (set at start
    # by `service.backends.threads.fit_one_thread`; 0: every batch on `session`)
    one_thread_up_to = 0

    def __init__(self, path: Path, threads: int, dtype: str = "float32") -> None:
        self.path = path
        self.dtype = dtype
        self.threads = threads
        self.session = _session(path, threads)
        self.one_thread: ort.InferenceSession | None = None  # made by the first `forward_on`
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._first_output = self.session.get_outputs()[0].name

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        small = int(inputs["input_ids"].numel()) <= self.one_thread_up_to
        return self.forward_on(inputs, 1 if small else self.threads)

    def all_threads(self) -> int:
        return self.threads

    def forward_on(self, inputs: Mapping[str, torch.Tensor], threads: int) -> torch.Tensor:
        """`forward` on `session`, or for `threads` 1 on the one-thread session (made now if
        it is not yet)."""
        import torch

        session = self.session
        if threads == 1 and self.threads > 1:
            if self.one_thread is None:
                self.one_thread = _session(self.path, 1)
            session = self.one_thread
        (output,) = session.run([self._first_output], graph_feed(inputs, self.input_names))
        return torch.from_numpy(output).float()

    def release_one_thread(self) -> None:
        self.one_thread = None

    def one_thread_affordable(self) -> bool:
        """The graph is small enough for a second session (`ONE_THREAD_MAX_GRAPH_BYTES`)."""
        size = sum(
            f.stat().st_size for f in self.path.parent.glob(self.path.name + "*") if f.is_file()
        )
        return size <= ONE_THREAD_MAX_GRAPH_BYTES


def _session(path: Path, threads: int) -> ort.InferenceSession:
    import onnxruntime as ort

    return ort.InferenceSession(
        str(path), session_options(threads), providers=["CPUExecutionProvider"]
    )


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
