"""In process: what padding costs each backend, and what packed batches give back.

    python -m loadtest.experiments.packing [--n 2000] [--budget-s 12] [--rounds 4] [--corpus short]
                               [--threads N]

For each backend and dtype served here (torch float32, torch bfloat16 where the CPU has it,
onnxruntime float32), built as the server builds it (`load_engine` with BACKEND/DTYPE), the
server's own path (`engine.prepare_many` + `engine.run`: tokenize, forward, pooling,
normalize) on batches of 32 of the corpus:

- in arrival order, padded: what 32 closed-loop clients hand a padding batcher;
- in arrival order, packed (`service.backends.packed`; torch only: the ONNX graph takes
  padded inputs);
- formed under load, packed: the batches the server's policy forms at 128 closed-loop clients
  (`service.engine.batching.policy.nearest_run` over a pool of 128 in arrival order: the
  oldest input and the 31 nearest to it in length among the oldest 64, then 32 more
  arrive);
- length-sorted over the whole corpus, padded: the least padding batches of 32 can have.

Each prints inputs/s, CPU milliseconds per input (every thread of the process: on shared
cores it moves less than the wall clock) and the tokens the token-wise parts compute per real
token (padded: inputs x longest over the real tokens; packed: 1, attention aside). A
backend's ways are timed
side by side, in `--rounds` alternating rounds of `--budget-s / --rounds` seconds each, so
that a neighbour's load on shared cores falls on all of them alike; read the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = (("torch", "float32"), ("torch", "bfloat16"), ("onnx", "float32"))
SIZE = 32
UNDER_LOAD = 128  # inputs waiting: 128 closed-loop clients


def batches(lengths: Sequence[int], size: int, sort: bool) -> list[list[int]]:
    """Indices of consecutive batches of `size`: in arrival order (the list's), or over the
    list sorted by length, the batches then in a shuffled order (a fixed seed): a way is timed
    for a budget, not whole passes, and sorted batches run shortest first would make a part
    of a pass look faster than the whole."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else range(len(lengths))
    order = list(order)
    groups = [order[i : i + size] for i in range(0, len(order), size)]
    if sort:
        random.Random(0).shuffle(groups)
    return groups


def formed(lengths: Sequence[int], size: int, pool: int) -> list[list[int]]:
    """Indices of the batches the packed batch policy forms (`nearest_run`) while `pool`
    inputs wait, in arrival order: each batch leaves as many places, taken by the next inputs
    of the list (the closed loop's clients sending again); the last inputs run as the pool
    drains. In a shuffled order (a fixed seed), as `batches` gives length-sorted ones."""
    from service.engine.batching.policy import nearest_run

    arrivals = iter(range(len(lengths)))
    waiting = list(itertools.islice(arrivals, pool))
    out: list[list[int]] = []
    while waiting:
        picked = nearest_run(
            [lengths[i] for i in waiting], must=None, max_size=size, max_tokens=None
        )
        out.append([waiting[k] for k in picked])
        taken = set(picked)
        waiting = [i for k, i in enumerate(waiting) if k not in taken]
        waiting += itertools.islice(arrivals, len(picked))
    random.Random(0).shuffle(out)
    return out


def computed_per_real(lengths: Sequence[int], groups: list[list[int]], packed: bool) -> float:
    """Tokens the token-wise parts compute per real token over `groups` of `lengths`."""
    from service.engine.batching.policy import computed_tokens

    computed = sum(computed_tokens([lengths[i] for i in g], packed=packed) for g in groups)
    return computed / sum(lengths[i] for g in groups for i in g)


def ways(engine: Any) -> dict[str, Any]:
    """The engine's ways of computing: padded and packed (torch, where the model packs), or
    padded alone (onnxruntime)."""
    from service.backends.packed import PackedTorchBackend
    from service.backends.torch_backend import TorchBackend
    from service.engine.forward.encoder import EncoderEngine

    backend = engine.backend
    if not isinstance(backend, TorchBackend):
        return {"padded": engine}
    pipe, model = engine.pipe, backend.model

    def with_backend(b: Any) -> Any:
        return EncoderEngine(pipe, engine.info, engine.sentence, b)

    out = {"padded": with_backend(TorchBackend(model, backend.device))}
    if isinstance(backend, PackedTorchBackend):
        out["packed"] = with_backend(backend)
    return out


class Timed:
    """One way on one order of batches, timed across rounds: where it left off, inputs and
    seconds so far."""

    def __init__(self, engine: Any, texts: list[str], groups: list[list[int]]) -> None:
        from service.engine.jobs import Op, Unit
        from service.engine.params import EmbedParams

        self.engine = engine
        cut = EmbedParams(truncate=True)  # the mixed corpus's longest inputs pass the limit
        self.batches = [[Unit(op=Op.EMBED, text=texts[i], params=cut) for i in g] for g in groups]
        self.next, self.inputs, self.seconds, self.cpu_s = 0, 0, 0.0, 0.0
        self.engine.run(self.engine.prepare_many(self.batches[0]))  # untimed: first shapes

    def run_for(self, budget_s: float) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - started < budget_s:
            units = self.batches[self.next % len(self.batches)]
            self.engine.run(self.engine.prepare_many(units))
            self.next += 1
            self.inputs += len(units)
        self.seconds += time.perf_counter() - started
        self.cpu_s += time.process_time() - cpu

    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    def cpu_ms(self) -> float:
        """CPU milliseconds per input, every thread of this process (tokenizer and model)."""
        return 1000 * self.cpu_s / self.inputs if self.inputs else 0.0


def measure(
    texts: list[str], budget_s: float, rounds: int, threads: int | None = None
) -> list[dict[str, Any]]:
    from service.engine.loading.load import load_engine
    from service.settings import Settings

    rows: list[dict[str, Any]] = []
    lengths: list[int] | None = None
    for backend, dtype in BACKENDS:
        settings = Settings(backend=backend, dtype=dtype, torch_num_threads=threads)  # type: ignore[arg-type]
        engine = load_engine(settings)
        if (engine.info.backend, engine.info.dtype) != (backend, dtype):
            rows.append({"backend": backend, "dtype": dtype, "skipped": "not served here"})
            continue
        if lengths is None:
            lengths = [p.n_tokens for p in engine.prepare_many(_units(texts))]
        arrival, ordered = batches(lengths, SIZE, False), batches(lengths, SIZE, True)
        found = ways(engine)
        cases = [("arrival", "padded", arrival)]
        if "packed" in found:
            cases.append(("arrival", "packed", arrival))
            cases.append(("formed", "packed", formed(lengths, SIZE, UNDER_LOAD)))
        cases.append(("sorted", "padded", ordered))
        timed = [Timed(found[way], texts, groups) for _, way, groups in cases]
        for _ in range(rounds):
            for t in timed:
                t.run_for(budget_s / rounds)
        for (order, way, groups), t in zip(cases, timed, strict=True):
            rows.append(
                {
                    "backend": backend,
                    "dtype": dtype,
                    "order": order,
                    "compute": way,
                    "inputs_per_s": round(t.rate(), 1),
                    "cpu_ms_per_input": round(t.cpu_ms(), 2),
                    "computed_per_real": round(
                        computed_per_real(lengths, groups, way == "packed"), 3
                    ),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _units(texts: list[str]) -> list[Any]:
    from service.engine.jobs import Op, Unit
    from service.engine.params import EmbedParams

    return [Unit(op=Op.EMBED, text=t, params=EmbedParams(truncate=True)) for t in texts]


ORDERS = {"arrival": "arrival order", "formed": "formed under load", "sorted": "length-sorted"}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per backend and way, the ratio to its arrival-order padded rate."""
    lines = [
        "| backend | batches of 32 | inputs/s | x arrival padded | CPU ms / input "
        "| tokens computed / real |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    base: dict[tuple[str, str], float] = {}
    for r in rows:
        name = f"{'onnxruntime' if r['backend'] == 'onnx' else r['backend']} {r['dtype']}"
        if "skipped" in r:
            lines.append(f"| {name} | {r['skipped']} | | | | |")
            continue
        key = (r["backend"], r["dtype"])
        base.setdefault(key, r["inputs_per_s"])
        way = f"{ORDERS[r['order']]}, {r['compute']}"
        ratio = r["inputs_per_s"] / base[key] if base[key] else 0.0
        lines.append(
            f"| {name} | {way} | {r['inputs_per_s']} | {ratio:.2f} | {r['cpu_ms_per_input']} "
            f"| {r['computed_per_real']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    from loadtest.corpus import mixed_inputs, short_inputs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="inputs of the corpus")
    parser.add_argument("--budget-s", type=float, default=12.0, help="seconds per way")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    parser.add_argument("--corpus", choices=("short", "mixed"), default="short")
    parser.add_argument(
        "--threads", type=int, help="torch and onnxruntime threads (default: the server's)"
    )
    args = parser.parse_args()
    make = short_inputs if args.corpus == "short" else mixed_inputs
    texts = [str(t) for t in make(args.n)]
    print(table(measure(texts, args.budget_s, args.rounds, args.threads)))


if __name__ == "__main__":
    main()
