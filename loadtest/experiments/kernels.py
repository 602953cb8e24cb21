"""In process: kernels compiled per batch, and what a batch costs the first time it is seen.

    python -m loadtest.experiments.kernels [--n 1024] [--backend torch] [--dtype bfloat16]
                                           [--threads N] [--json PATH]

oneDNN (torch's bfloat16 matrix products on the CPU) compiles a kernel for each new shape it
meets and keeps it in its primitive cache. This loads the engine as the server does
(`load_engine`, then the server's warm-up: `service.backends.packed.warm_kernels`) with
``ONEDNN_VERBOSE=profile_create`` and, on arrival-order batches of 32 of the short corpus,
runs side by side, batch by batch (the order rotated each batch):

- the packed forward with shape buckets (the server's, `service.backends.packing`), each batch
  once and then again at once;
- the packed forward with exact shapes (buckets off), likewise;
- transformers' own padded forward on length-sorted batches of the same inputs (in a shuffled
  order), the plain reference.

For each it prints CPU milliseconds per input (every thread of this process: tokenizer, model
and pooling), oneDNN kernel creations per batch, and the first run's CPU over the second's;
and what the buckets add: packed rows over real tokens, attention pairs over unbucketed ones.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIZE = 32


class Way:
    """One way of running the batches: its engine and its running totals."""

    def __init__(self, name: str, engine: Any) -> None:
        self.name, self.engine = name, engine
        self.inputs = 0
        self.cpu_s = {"first": 0.0, "second": 0.0}
        self.created = {"first": 0, "second": 0}
        self.batches = 0

    def run(self, units: list[Any], counter: Any, twice: bool) -> None:
        counter.take()
        for run in ("first", "second") if twice else ("first",):
            started = time.process_time()
            self.engine.run(self.engine.prepare_many(units))
            self.cpu_s[run] += time.process_time() - started
            self.created[run] += counter.take()
        self.inputs += len(units)
        self.batches += 1

    def row(self, twice: bool) -> dict[str, Any]:
        per = 1000 / max(1, self.inputs)
        out: dict[str, Any] = {
            "way": self.name,
            "batches": self.batches,
            "cpu_ms_per_input": round(self.cpu_s["first"] * per, 3),
            "creations_per_batch": round(self.created["first"] / max(1, self.batches), 2),
        }
        if twice:
            out["second_cpu_ms_per_input"] = round(self.cpu_s["second"] * per, 3)
            out["second_creations_per_batch"] = round(
                self.created["second"] / max(1, self.batches), 2
            )
            out["first_over_second"] = round(
                self.cpu_s["first"] / max(1e-9, self.cpu_s["second"]), 3
            )
        return out


def bucket_overhead(engine: Any, groups: list[list[Any]]) -> dict[str, float]:
    """Packed rows over real tokens, and attention pairs (width^2 per sequence) of bucketed
    groups over exact ones, over the batches `groups` (prepared inputs)."""
    from service.backends.packing import Packing

    rows = real = pairs = exact_pairs = 0
    for prepared in groups:
        mask = engine.padded(prepared)["attention_mask"]
        for packing, counter in ((Packing.of(mask, True), 1), (Packing.of(mask, False), 0)):
            got = sum(g.count * g.width * g.width for g in packing.groups)
            if counter:
                rows += packing.size
                real += packing.tokens
                pairs += got
            else:
                exact_pairs += got
    return {
        "rows_over_tokens": round(rows / max(1, real), 4),
        "attention_pairs_over_exact": round(pairs / max(1, exact_pairs), 4),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["ONEDNN_VERBOSE"] = "profile_create"
    from loadtest.kernels import Creations

    counter = Creations()  # before torch loads: oneDNN prints to descriptor 1
    import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

    from loadtest.corpus import short_inputs
    from service.backends.packed import PackedTorchBackend, warm_kernels
    from service.backends.torch_backend import TorchBackend
    from service.engine.batching.batcher import MAX_WARM_TOKENS
    from service.engine.forward.encoder import EncoderEngine
    from service.engine.jobs import Op, Unit
    from service.engine.loading.load import load_engine
    from service.engine.loading.warmup import calibrate, warm_up
    from service.engine.params import EmbedParams
    from service.settings import Settings

    settings = Settings(
        backend=args.backend,
        dtype=args.dtype,
        torch_num_threads=args.threads,
    )
    started = time.perf_counter()
    engine = load_engine(settings)
    warm_up(engine)
    calibrate(engine)
    loaded_s = time.perf_counter() - started
    counter.take()
    rss = psutil.Process().memory_info().rss
    started, cpu = time.perf_counter(), time.process_time()
    shapes = warm_kernels(
        engine.backend,
        min(settings.max_batch_tokens or MAX_WARM_TOKENS, MAX_WARM_TOKENS),
        settings.max_batch_size,
        engine.info.max_input_tokens,
    )
    warm = {
        "shapes": shapes,
        "seconds": round(time.perf_counter() - started, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "creations": counter.take(),
        "load_s": round(loaded_s, 2),
        "rss_mb_before": round(rss / 1e6),
        "rss_mb_after": round(psutil.Process().memory_info().rss / 1e6),
    }
    print(json.dumps({"warm": warm}), flush=True)
    backend = engine.backend
    packed = getattr(backend, "large", backend)
    if not isinstance(packed, PackedTorchBackend):
        raise SystemExit(f"the served backend does not pack: {engine.info.backend_summary}")

    def with_backend(b: Any) -> Any:
        return EncoderEngine(engine.pipe, engine.info, engine.sentence, b)

    exact = copy.copy(packed)
    exact._packed = exact.packed = copy.copy(packed.packed)
    exact.packed.buckets = False
    ways = [
        Way("packed, buckets (served)", with_backend(packed)),
        Way("packed, exact shapes", with_backend(exact)),
        Way("padded, transformers, length-sorted", with_backend(TorchBackend(packed.model, "cpu"))),
    ]
    texts = [str(t) for t in short_inputs(args.n)]
    units = [Unit(op=Op.EMBED, text=t, params=EmbedParams(truncate=True)) for t in texts]
    lengths = [p.n_tokens for p in engine.prepare_many(units)]
    arrival = [units[i : i + SIZE] for i in range(0, len(units), SIZE)]
    order = sorted(range(len(units)), key=lambda i: lengths[i])
    ordered = [[units[i] for i in order[s : s + SIZE]] for s in range(0, len(order), SIZE)]
    random.Random(0).shuffle(ordered)
    for k, batch in enumerate(arrival):
        for j in range(len(ways)):
            way = ways[(k + j) % len(ways)]
            if way is ways[2]:
                way.run(ordered[k], counter, twice=False)
            else:
                way.run(batch, counter, twice=True)
    rows = [w.row(twice=w is not ways[2]) for w in ways]
    overhead = bucket_overhead(engine, [engine.prepare_many(b) for b in arrival])
    return {"warm": warm, "ways": rows, "buckets": overhead, "inputs": len(units)}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['inputs']} short inputs, batches of {SIZE}; warm-up: {result['warm']}",
        "",
        "| way | CPU ms/input | kernels made/batch | again at once: CPU ms/input | kernels "
        "| first / again |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["ways"]:
        lines.append(
            f"| {r['way']} | {r['cpu_ms_per_input']} | {r['creations_per_batch']} | "
            f"{r.get('second_cpu_ms_per_input', '-')} | "
            f"{r.get('second_creations_per_batch', '-')} | {r.get('first_over_second', '-')} |"
        )
    lines += ["", f"buckets: {result['buckets']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="inputs of the short corpus")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, help="torch threads (default: the server's)")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    result = measure(args)
    print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
