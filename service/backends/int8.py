"""DTYPE=int8: a calibrated static int8 (QDQ) of the float32 graph, SmoothQuant first, made by
onnxruntime's quantizer and run on OpenVINO (`service.backends.openvino_backend`).

The recipe (`RECIPE`; docs/backends.md gives what each option tried measured):
- calibration: the engine's own padded batches of the calibration texts (CALIBRATION_FILE, else
  the packaged set that also calibrates int8/uint8 embeddings;
  `service.engine.loading.quantization`), 32 texts a batch, length-sorted;
- SmoothQuant (Xiao et al. 2023, eq. 4, alpha 0.5): for each quantized MatMul input X and the
  weights W [C_in, C_out] that read it, s_j = max|X_j|^a / max_k|W_jk|^(1-a) over the
  calibration's real tokens; a Mul by 1/s is inserted on X and W's rows are scaled by s, so the
  float graph computes the same and the activations' outlier channels move into the weights;
- `quantize_static`, QDQ, MinMax ranges: activations uint8 per tensor (asymmetric), weights
  int8 per output channel, every MatMul output left float (quantized outputs cost a cosine
  of 0.93);
- which MatMuls: those with constant weights that do not narrow (C_in <= C_out: query, key,
  value, attention output, feed-forward input); those that narrow (the feed-forward output
  projection, whose GELU input has per-token outliers, and classifier heads), the attention's
  score products, Softmax, LayerNorm and GELU stay float.
Opt-in only: `auto` never serves it; its quality is measured at start (/info's candidate row)
and `quantization` in /info names the recipe. The graph is cached beside the float32 one, its
name keyed by the recipe, the calibration texts' digest and onnxruntime's version; a read-only
model folder's goes to the cache folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.backends.export import cache_root, publish
from service.backends.openvino_backend import OpenVinoBackend

if TYPE_CHECKING:
    import onnx
    import torch

FORMAT = 1  # bumped when what the recipe does changes
RECIPE: Mapping[str, str | float] = {
    "method": "static QDQ (onnxruntime quantize_static)",
    "calibration": "MinMax",
    "smooth_quant_alpha": 0.5,
    "activations": "uint8, per tensor",
    "weights": "int8, per output channel",
    "quantized": "MatMuls with constant weights that do not narrow (C_in <= C_out)",
    "float": "narrowing MatMuls (feed-forward output, heads), attention scores, MatMul outputs",
    "runtime": "OpenVINO (CPU plugin, its default inference precision for what stays float)",
    "format": FORMAT,
}


@dataclass(frozen=True)
class CalibrationBatches:
    """The texts the graph is calibrated on: their SHA-256 (part of the cache key) and a
    callable giving their padded int64 batches ({input name: [B, L]}), as the engine feeds."""

    sha256: str
    batches: Callable[[], Iterable[Mapping[str, torch.Tensor]]]


class CalibrationReader:
    """onnxruntime's `CalibrationDataReader` over `batches`: each as numpy int64, only the
    inputs the graph takes (`names`; a missing `token_type_ids` as zeros), then None."""

    def __init__(self, batches: Iterable[Mapping[str, torch.Tensor]], names: list[str]) -> None:
        self._batches = (_feed(batch, names) for batch in batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.get_next, None)


def _feed(batch: Mapping[str, torch.Tensor], names: list[str]) -> dict[str, np.ndarray]:
    def array(x: torch.Tensor | np.ndarray) -> np.ndarray:
        return np.asarray(x.numpy() if hasattr(x, "numpy") else x, dtype=np.int64)

    ids = array(batch["input_ids"])
    return {n: array(batch[n]) if n in batch else np.zeros_like(ids) for n in names}


def cache_name(calibration: CalibrationBatches) -> str:
    """`model.int8-<key>.onnx`: the key a SHA-256 of the recipe, the calibration texts' digest
    and onnxruntime's version (first 16 hex digits)."""
    import onnxruntime

    text = json.dumps([RECIPE, calibration.sha256, onnxruntime.__version__], sort_keys=True)
    return f"model.int8-{hashlib.sha256(text.encode()).hexdigest()[:16]}.onnx"


def quantized(graph: Path, calibration: CalibrationBatches) -> Path:
    """The int8 graph made from the float32 `graph` (made now unless cached)."""
    target = graph.with_name(cache_name(calibration))
    if not os.access(graph.parent, os.W_OK):  # the image's read-only model folder
        key = hashlib.sha256(str(graph.resolve()).encode()).hexdigest()[:24]
        target = cache_root() / f"int8-{key}" / target.name
    if target.is_file() and target.stat().st_mtime >= graph.stat().st_mtime:
        return target
    quantize(graph, target, calibration)
    return target


def quantize(source: Path, target: Path, calibration: CalibrationBatches) -> None:
    """`RECIPE` applied to `source`, written atomically to `target`."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = onnx.load(str(source))
    names = [i.name for i in model.graph.input]
    nodes = smooth(model, list(calibration.batches()), names, float(RECIPE["smooth_quant_alpha"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=target.parent)
    os.close(fd)
    root = logging.getLogger()
    level = root.level
    # The quantizer logs a generic "consider pre-processing" warning on the root logger at
    # every call (start only, inference thread): not a line for the service's log.
    root.setLevel(logging.ERROR)
    try:
        quantize_static(
            model,
            tmp,
            CalibrationReader(calibration.batches(), names),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=nodes,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]},
        )
        publish(tmp, target)
    finally:
        root.setLevel(level)
        Path(tmp).unlink(missing_ok=True)


def smooth(
    model: onnx.ModelProto,
    batches: list[Mapping[str, torch.Tensor]],
    names: list[str],
    alpha: float,
) -> list[str]:
    """SmoothQuant on `model` (an `onnx.ModelProto`, changed in place) for the MatMuls to
    quantize (constant weights [C_in, C_out], C_in <= C_out); returns their names."""
    weights = {i.name: i for i in model.graph.initializer}
    chosen = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            shape = weights[node.input[1]].dims
            if len(shape) == 2 and shape[0] <= shape[1]:
                chosen.append(node)
    smooth_matmuls(model, chosen, [_feed(batch, names) for batch in batches], alpha)
    return [n.name for n in chosen]


def smooth_matmuls(
    model: onnx.ModelProto,
    matmuls: list[onnx.NodeProto],
    feeds: list[dict[str, np.ndarray]],
    alpha: float,
) -> None:
    """SmoothQuant (Xiao et al. 2023, eq. 4: s_j = max|X_j|^alpha / max|W_j|^(1-alpha)) on
    `matmuls`, nodes of `model` (an `onnx.ModelProto`, changed in place) with constant weights
    [C_in, C_out]: each input's per-channel range over the real tokens of `feeds` moves into
    the weights (W * s), and a Mul by 1/s is inserted after the input's producer. MatMuls
    sharing an input share its scales."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    weights = {i.name: i for i in model.graph.initializer}
    inputs = sorted({n.input[0] for n in matmuls})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in inputs:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    amax: dict[str, np.ndarray] = {}
    for feed in feeds:
        real = feed["attention_mask"].astype(bool)
        for name, x in zip(inputs, session.run(inputs, feed), strict=True):
            amax[name] = np.maximum(amax.get(name, 0.0), np.abs(x[real]).max(0))
    for name in inputs:
        group = [n for n in matmuls if n.input[0] == name]
        arrays = [numpy_helper.to_array(weights[n.input[1]]) for n in group]
        wmax = np.max([np.abs(w).max(1) for w in arrays], axis=0)
        s = np.clip(amax[name] ** alpha / np.maximum(wmax, 1e-8) ** (1 - alpha), 1e-5, None)
        for node, w in zip(group, arrays, strict=True):
            scaled = (w * s[:, None]).astype(np.float32)
            weights[node.input[1]].CopyFrom(numpy_helper.from_array(scaled, node.input[1]))
        scale = numpy_helper.from_array((1 / s).astype(np.float32), f"{name}_smooth_scale")
        model.graph.initializer.append(scale)
        mul = helper.make_node("Mul", [name, scale.name], [f"{name}_smoothed"], f"{name}_smooth")
        for node in group:
            node.input[0] = mul.output[0]
        at = next((i + 1 for i, n in enumerate(model.graph.node) if name in n.output), 0)
        model.graph.node.insert(at, mul)


def backend(graph: Path, threads: int, calibration: CalibrationBatches) -> OpenVinoBackend:
    """OpenVINO over the int8 graph of the float32 `graph`."""
    served = OpenVinoBackend(quantized(graph, calibration), threads, dtype="int8")
    served.quantization = dict(RECIPE)
    return served
