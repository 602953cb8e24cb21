"""In-process speed and quality of every backend on the short-input corpus (docs/backends.md).

    python -m loadtest.experiments.backends [--n 2000] [--budget-s 20] [--out backends.json]

For each backend and dtype the server can serve (torch float32, torch bfloat16, onnxruntime
float32, int8 on OpenVINO), built as the server builds it (`load_engine` with BACKEND/DTYPE):
tokenizer + forward + pooling + normalize (`engine.prepare` + `engine.run`, the server's own
path) on length-sorted batches of 32, 8 and 1, inputs/s over a time budget per batch size; and
its sentence embeddings against torch float32's on the whole corpus: cosine (min / mean) and
how many of each input's 10 nearest neighbours stay the same, over the 2,000 inputs and over
its distinct texts. The corpus repeats texts (2,000 inputs hold 598 distinct ones, some 31
times): over all inputs a text's copies tie at a cosine of 1, and which copies make its top 10
turns on rounding alone (onnxruntime float32 keeps 97%, torch bfloat16 77%); over the distinct
texts (each once) only real neighbours count. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from loadtest.corpus import short_inputs

BACKENDS = (("torch", "float32"), ("torch", "bfloat16"), ("onnx", "float32"), ("openvino", "int8"))
SIZES = (32, 8, 1)


def embed_all(engine: Any, texts: list[str], size: int = 32) -> np.ndarray:
    """Every text's sentence embedding, in order (length-sorted batches of `size`)."""
    from service.engine.jobs import Op, Unit

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[Any] = [None] * len(texts)
    for start in range(0, len(order), size):
        ids = order[start : start + size]
        units = [Unit(op=Op.EMBED, text=texts[i]) for i in ids]
        for i, answer in zip(ids, engine.run(engine.prepare_many(units)), strict=True):
            out[i] = answer
    return np.stack(out)


def throughput(engine: Any, texts: list[str], size: int, budget_s: float) -> float:
    """Inputs/s of prepare + run on length-sorted batches of `size`, spread over the lengths,
    until `budget_s` has passed (after one untimed batch)."""
    from service.engine.jobs import Op, Unit

    ordered = sorted(texts, key=len)
    batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    step = max(1, len(batches) // 64)
    picks = [batches[(k * step) % len(batches)] for k in range(len(batches))]
    engine.run(engine.prepare_many([Unit(op=Op.EMBED, text=t) for t in picks[0]]))
    done, started = 0, time.perf_counter()
    for batch in picks:
        engine.run(engine.prepare_many([Unit(op=Op.EMBED, text=t) for t in batch]))
        done += len(batch)
        if time.perf_counter() - started > budget_s:
            break
    return done / (time.perf_counter() - started)


def neighbours_kept(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Share of each input's k nearest neighbours (cosine, itself left out) kept."""

    def top(e: np.ndarray) -> np.ndarray:
        sims = e @ e.T
        np.fill_diagonal(sims, -np.inf)
        return np.argsort(-sims, axis=1)[:, :k]

    a, b = top(reference), top(other)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)]))


def distinct(texts: list[str]) -> list[int]:
    """The index of each text's first occurrence, in order (each distinct text once)."""
    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    return list(first.values())


def measure(n: int, budget_s: float) -> list[dict[str, Any]]:
    from service.engine.loading.load import load_engine
    from service.settings import Settings

    texts = short_inputs(n)
    once = distinct(texts)
    rows, reference = [], None
    for backend, dtype in BACKENDS:
        setting = "auto" if backend == "openvino" else backend  # DTYPE=int8 picks OpenVINO
        engine = load_engine(Settings(backend=setting, dtype=dtype))  # type: ignore[arg-type]
        if (engine.info.backend, engine.info.dtype) != (backend, dtype):
            rows.append({"backend": backend, "dtype": dtype, "skipped": "not served here"})
            continue
        speeds = {size: throughput(engine, texts, size, budget_s) for size in SIZES}
        vectors = embed_all(engine, texts)
        if reference is None:
            reference = vectors
        cos = (reference * vectors).sum(1) / (
            np.linalg.norm(reference, axis=1) * np.linalg.norm(vectors, axis=1)
        )
        rows.append(
            {
                "backend": backend,
                "dtype": dtype,
                "inputs_per_s": {str(s): round(v, 1) for s, v in speeds.items()},
                "cosine_min": round(float(cos.min()), 5),
                "cosine_mean": round(float(cos.mean()), 5),
                "top10_kept": round(neighbours_kept(reference, vectors), 4),
                "top10_kept_distinct": round(neighbours_kept(reference[once], vectors[once]), 4),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if "inputs_per_s" in r)["inputs_per_s"]["32"]
    lines = [
        "| backend | batch 32, inputs/s | x torch fp32 | batch 8 | batch 1 "
        "| cosine min / mean | top-10 kept | top-10 kept, distinct texts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "inputs_per_s" not in r:
            lines.append(f"| {r['backend']} {r['dtype']} | {r['skipped']} | | | | | | |")
            continue
        s = r["inputs_per_s"]
        lines.append(
            f"| {r['backend']} {r['dtype']} | {s['32']} | {s['32'] / base:.2f} | {s['8']} | "
            f"{s['1']} | {r['cosine_min']} / {r['cosine_mean']} | {r['top10_kept']:.1%} | "
            f"{r['top10_kept_distinct']:.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="inputs of the short corpus")
    parser.add_argument("--budget-s", type=float, default=20.0, help="seconds per batch size")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = measure(args.n, args.budget_s)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
