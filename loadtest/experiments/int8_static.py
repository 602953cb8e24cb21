"""Calibrated static int8 (onnxruntime QDQ) against float32 and dynamic int8 (docs/backends.md).

    python -m loadtest.experiments.int8_static [--n 2000] [--rounds 3] [--out int8_static.json]

The float32 graph is the server's own export (`BACKEND=onnx DTYPE=float32`, cached), run
through `quant_pre_process` (shape inference skipped: the exported graph's symbolic shapes do
not resolve). Each recipe of `RECIPES` is `quantize_static` in QDQ format, calibrated on the
package's calibration texts (`service/data/calibration.txt`, never the evaluation corpus),
tokenized by the model's tokenizer in length-sorted padded batches of 32 (`CalibrationReader`);
Percentile and Entropy need batches of one shape (padded to 128 tokens, full batches only).
Recipes marked `smooth` first move each weight MatMul's per-input-channel activation range into
its weights (SmoothQuant, Xiao et al. 2023, eq. 4: s_j = max|X_j|^a / max|W_j|^(1-a), X / s
by an inserted Mul, W * s), the ranges taken over the calibration texts' real tokens. MatMul
outputs stay float (fused into MatMulIntegerToFloat) unless a recipe says "outputs quantized"
(onnxruntime's default: QLinearMatMul). The served recipe is `service.backends.int8`'s.

Evaluated on `short_inputs(n)` (none of them in the calibration set): each graph's mean-pooled,
normalized sentence embeddings against the float32 graph's: cosine min / mean, and the share
of each text's 10 nearest neighbours kept, over its distinct texts (the corpus repeats texts:
`loadtest.experiments.backends`). Speed: inputs/s of the graph alone (onnxruntime with the
server's session options, 2 threads; batches of 32, length-sorted, tokenized beforehand), each
graph once per round, rounds alternated, the best round kept; beside them the engines of torch
bfloat16 and of the served int8 (the served recipe's graph on OpenVINO; `engine.prepare_many` +
`engine.run`: tokenizing included), as the backends study times them. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from loadtest.corpus import short_inputs
from loadtest.experiments.backends import distinct, neighbours_kept, throughput

BATCH = 32
FIXED_LENGTH = 128  # Percentile / Entropy: one batch shape
LAYERS = 6
_L = "/model/encoder/layer.{i}/"
#: The weight MatMuls of a BERT encoder layer by role, and the attention's two products.
GROUPS = {
    "qkv": [_L + f"attention/self/{p}/MatMul" for p in ("query", "key", "value")],
    "attention output": [_L + "attention/output/dense/MatMul"],
    "ffn in": [_L + "intermediate/dense/MatMul"],
    "ffn out": [_L + "output/dense/MatMul"],
    "scores": [_L + "attention/self/MatMul", _L + "attention/self/MatMul_1"],
}
WEIGHTS = ("qkv", "attention output", "ffn in", "ffn out")


@dataclass(frozen=True)
class Recipe:
    """One static quantization: the node groups quantized, the calibration method,
    per-channel weights, activation type (asymmetric uint8, or symmetric int8) and
    SmoothQuant's alpha (None: none)."""

    groups: tuple[str, ...] = WEIGHTS
    method: str = "MinMax"
    per_channel: bool = True
    symmetric: bool = False
    smooth: float | None = None
    float_outputs: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def name(self) -> str:
        parts = ["+".join(self.groups), self.method]
        parts += [] if self.per_channel else ["per-tensor"]
        parts += ["int8 symmetric" if self.symmetric else "uint8"]
        parts += [f"smooth {self.smooth}"] if self.smooth is not None else []
        parts += [] if self.float_outputs else ["outputs quantized"]
        return ", ".join(parts)


RECIPES = (
    Recipe(float_outputs=False),
    Recipe(groups=("ffn out",), float_outputs=False),
    Recipe(),
    Recipe(groups=(*WEIGHTS, "scores")),
    Recipe(per_channel=False),
    Recipe(symmetric=True),
    Recipe(method="Percentile"),
    Recipe(method="Entropy"),
    Recipe(smooth=0.5),
    Recipe(smooth=0.75),
    *(Recipe(groups=(g,)) for g in (*WEIGHTS, "scores")),
    Recipe(groups=("qkv", "attention output", "ffn in", "scores")),
    Recipe(groups=("qkv", "attention output")),
    Recipe(groups=("qkv", "attention output"), smooth=0.5),
    Recipe(groups=("qkv", "attention output", "ffn in"), smooth=0.5),  # served
    Recipe(groups=("qkv", "attention output", "ffn in"), smooth=0.75),
)


class CalibrationReader:
    """onnxruntime's `CalibrationDataReader`: `texts` tokenized as the graph takes them
    ({name: int64 [B, L]} for `names`), length-sorted batches of `size`, padded to the batch's
    longest (or to `fixed` tokens, full batches only), then None."""

    def __init__(
        self, tokenizer: Any, texts: list[str], names: list[str], size: int = BATCH, fixed: int = 0
    ) -> None:
        self._batches = iter(
            feed
            for ids, feed in batches(tokenizer, texts, names, size, fixed)
            if not fixed or len(ids) == size
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.get_next, None)


def batches(
    tokenizer: Any, texts: list[str], names: list[str], size: int = BATCH, fixed: int = 0
) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """(indices, feed) of `texts` in length-sorted batches of `size`."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), size):
        ids = order[start : start + size]
        enc = tokenizer(
            [texts[i] for i in ids],
            padding="max_length" if fixed else True,
            max_length=fixed or None,
            truncation=True,
            return_tensors="np",
        )
        yield ids, {n: np.asarray(enc[n], dtype=np.int64) for n in names}


def smooth(source: Path, target: Path, feeds: list[dict[str, np.ndarray]], alpha: float) -> None:
    """SmoothQuant on every weight MatMul of `source` (the server's
    `service.backends.int8.smooth_matmuls`, which the served recipe applies to the widening
    ones only), written to `target`."""
    import onnx

    from service.backends.int8 import smooth_matmuls

    model = onnx.load(str(source))
    weights = {i.name for i in model.graph.initializer}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    smooth_matmuls(model, matmuls, feeds, alpha)
    onnx.save(model, str(target))


def quantize(source: Path, target: Path, recipe: Recipe, tokenizer: Any, texts: list[str]) -> None:
    """`recipe` applied to `source` (pre-processed float32), written to `target`."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    names = ["input_ids", "attention_mask", "token_type_ids"]
    if recipe.smooth is not None:
        smoothed = target.with_suffix(".smooth.onnx")
        smooth(source, smoothed, [f for _, f in batches(tokenizer, texts, names)], recipe.smooth)
        source = smoothed
    fixed = 0 if recipe.method == "MinMax" else FIXED_LENGTH
    nodes = [n.format(i=i) for g in recipe.groups for n in GROUPS[g] for i in range(LAYERS)]
    quantize_static(
        str(source),
        str(target),
        CalibrationReader(tokenizer, texts, names, fixed=fixed),  # type: ignore[arg-type]
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        nodes_to_quantize=nodes,
        per_channel=recipe.per_channel,
        activation_type=QuantType.QInt8 if recipe.symmetric else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, recipe.method),
        extra_options={
            "ActivationSymmetric": recipe.symmetric,
            "OpTypesToExcludeOutputQuantization": ["MatMul"] if recipe.float_outputs else [],
            **recipe.extra,
        },
    )


def embed(session: Any, feeds: list[tuple[list[int], dict[str, np.ndarray]]], n: int) -> Any:
    """(normalized mean-pooled embeddings [n, H] in input order, inputs/s of the runs)."""
    out: np.ndarray | None = None
    session.run(None, feeds[len(feeds) // 2][1])
    started = time.perf_counter()
    for ids, feed in feeds:
        (rows,) = session.run(None, feed)
        mask = feed["attention_mask"][..., None].astype(np.float32)
        vectors = (rows * mask).sum(1) / mask.sum(1)
        if out is None:
            out = np.zeros((n, vectors.shape[1]), np.float32)
        out[ids] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return out, n / (time.perf_counter() - started)


def measure(n: int, rounds: int, work: Path) -> list[dict[str, Any]]:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    from service.backends.onnx_backend import session_options
    from service.engine.loading.load import load_engine
    from service.engine.pooling.calibration import read_set
    from service.settings import Settings

    onnx_engine = load_engine(Settings(backend="onnx", dtype="float32"))
    float32 = Path(onnx_engine.backend.path)  # type: ignore[attr-defined]
    tokenizer = onnx_engine.pipe.tokenizer  # type: ignore[attr-defined]
    calibration = list(read_set().texts)
    texts = short_inputs(n)
    assert not set(calibration) & set(texts), "the calibration texts must not be evaluated"
    work.mkdir(parents=True, exist_ok=True)
    pre = work / "float32.pre.onnx"
    quant_pre_process(str(float32), str(pre), skip_symbolic_shape=True)
    graphs = {"onnxruntime float32": float32, "dynamic int8 (graph)": work / "dynamic.onnx"}
    quantize_dynamic(
        str(float32),
        str(graphs["dynamic int8 (graph)"]),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )
    for k, recipe in enumerate(RECIPES):
        graphs[f"static: {recipe.name()}"] = target = work / f"static-{k}.onnx"
        quantize(pre, target, recipe, tokenizer, calibration)
    feeds = list(batches(tokenizer, texts, ["input_ids", "attention_mask", "token_type_ids"]))
    once = distinct(texts)
    engines = {
        "torch bfloat16 (engine)": load_engine(Settings(backend="torch", dtype="bfloat16")),
        "static int8 on OpenVINO, served (engine)": load_engine(Settings(dtype="int8")),
    }
    speeds: dict[str, list[float]] = {name: [] for name in [*engines, *graphs]}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, engine in engines.items():
            speeds[name].append(throughput(engine, texts, BATCH, 6.0))
        for name, path in graphs.items():
            session = ort.InferenceSession(str(path), session_options(2))
            vectors[name], speed = embed(session, feeds, len(texts))
            speeds[name].append(speed)
    reference = vectors["onnxruntime float32"]
    rows = []
    for name in speeds:
        row: dict[str, Any] = {"name": name, "inputs_per_s": round(max(speeds[name]), 1)}
        if name in vectors:
            cos = (reference * vectors[name]).sum(1)
            kept = neighbours_kept(reference[once], vectors[name][once])
            row |= {"cosine_min": round(float(cos.min()), 5)}
            row |= {"cosine_mean": round(float(cos.mean()), 5), "top10_kept_distinct": kept}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    bf16 = next(r["inputs_per_s"] for r in rows if r["name"].startswith("torch bfloat16"))
    lines = [
        "| graph | batch 32, inputs/s | x torch bf16 | cosine min / mean "
        "| top-10 kept (distinct) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        quality = "| |"
        if "cosine_min" in r:
            quality = f"| {r['cosine_min']} / {r['cosine_mean']} | {r['top10_kept_distinct']:.1%} |"
        lines.append(
            f"| {r['name']} | {r['inputs_per_s']} | {r['inputs_per_s'] / bf16:.2f} {quality}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="inputs of the short corpus")
    parser.add_argument("--rounds", type=int, default=3, help="alternated timing rounds")
    parser.add_argument("--work", type=Path, default=Path("int8-static"), help="graphs here")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = measure(args.n, args.rounds, args.work)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
