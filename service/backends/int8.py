"""DTYPE=int8: onnxruntime's dynamic int8 quantization of the float32 graph, per channel.

Weights of every MatMul become int8 with one scale per output channel; activations are
quantized per batch (`onnxruntime.quantization.quantize_dynamic`). Opt-in only: `auto` never
serves it, its measured quality is in /info and docs/backends.md. The quantized graph is
cached beside the float32 one (the same key) when that folder is writable, else in the cache.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from service.backends.export import cache_root, publish
from service.backends.onnx_backend import OnnxBackend

INT8_NAME = "model.int8.onnx"


def quantized(graph: Path) -> Path:
    """The int8 graph made from the float32 `graph` (made now unless cached)."""
    target = graph.with_name(INT8_NAME)
    if not os.access(graph.parent, os.W_OK):  # the image's read-only model folder
        import hashlib

        key = hashlib.sha256(str(graph.resolve()).encode()).hexdigest()[:24]
        target = cache_root() / f"int8-{key}" / INT8_NAME
    if target.is_file() and target.stat().st_mtime >= graph.stat().st_mtime:
        return target
    quantize(graph, target)
    return target


def quantize(source: Path, target: Path) -> None:
    """Dynamic int8, per channel, weights symmetric (QInt8), written atomically to `target`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=target.parent)
    os.close(fd)
    root = logging.getLogger()
    level = root.level
    # The quantizer logs a generic "consider pre-processing" warning on the root logger at
    # every call (start only, inference thread): not a line for the service's log.
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            source,
            tmp,
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
        )
        publish(tmp, target)
    finally:
        root.setLevel(level)
        Path(tmp).unlink(missing_ok=True)


def backend(graph: Path, threads: int) -> OnnxBackend:
    """An onnxruntime session over the int8 graph of the float32 `graph`."""
    return OnnxBackend(quantized(graph), threads, dtype="int8")
