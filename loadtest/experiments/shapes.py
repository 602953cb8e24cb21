"""In process: what a padded batch's first run of a shape costs, on every padded backend.

    python -m loadtest.experiments.shapes [--n 1024] [--threads N] [--no-openvino-float32]
                                          [--json PATH]

The packed torch path rounds its shapes up to buckets made at start (`loadtest.experiments.
kernels`); the padded backends meet a new [B, L] whenever a batch's longest input is a length
not seen yet. This loads the engine as the server does and, on arrival-order batches of 32 of
the short corpus, runs side by side, batch by batch (the order rotated each batch), each batch
once and then again at once, on:

- torch bfloat16 padded (`service.backends.torch_backend.TorchBackend`: transformers' own
  forward on the bfloat16 model, what serves a model that cannot pack);
- onnxruntime float32 (`service.backends.onnx_backend.OnnxBackend`, ``BACKEND=onnx``);
- OpenVINO on the int8 graph (``DTYPE=int8``);
- OpenVINO on the float32 graph (`OpenVinoBackend` over the onnx backend's graph).

For each it prints CPU milliseconds per input (every thread of this process: tokenizer, model
and pooling, until `SETTLE_S` after it ends), the first run's CPU over the second's on every
batch, on the batches whose shape that way had not run before and on the others, and oneDNN's
kernel creations per batch (counted under ``ONEDNN_VERBOSE=profile_create``,
`loadtest.kernels`: torch's, and OpenVINO's CPU plugin's, which prints the same lines).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIZE = 32
PARTS = ("all", "new", "seen")  # every batch; those of a shape new to the way; the others
# Each run is timed until this long after it ends: threads that spin waiting for the next
# parallel region (OpenMP's, OpenVINO's) count toward the run that left them spinning, not
# toward whichever runs next.
SETTLE_S = 0.05


class Way:
    """One backend running the batches, with its totals (`PARTS`): all batches, those whose
    padded shape it met for the first time, and the others."""

    def __init__(self, name: str, engine: Any) -> None:
        self.name, self.engine = name, engine
        self.seen: set[tuple[int, ...]] = set()
        self.inputs = dict.fromkeys(PARTS, 0)
        self.cpu_s = {(part, run): 0.0 for part in PARTS for run in ("first", "again")}
        self.created = {"first": 0, "again": 0}
        self.batches = dict.fromkeys(PARTS, 0)

    def run(self, units: list[Any], counter: Any) -> None:
        prepared = self.engine.prepare_many(units)
        shape = tuple(self.engine.padded(prepared)["input_ids"].shape)
        parts = ("all", "seen" if shape in self.seen else "new")
        self.seen.add(shape)
        counter.take()
        for run in ("first", "again"):
            started = time.process_time()
            self.engine.run(self.engine.prepare_many(units))
            time.sleep(SETTLE_S)
            spent = time.process_time() - started
            for part in parts:
                self.cpu_s[part, run] += spent
            self.created[run] += counter.take()
        for part in parts:
            self.inputs[part] += len(units)
            self.batches[part] += 1

    def row(self) -> dict[str, Any]:
        def ms(part: str, run: str) -> float:
            return round(1000 * self.cpu_s[part, run] / max(1, self.inputs[part]), 3)

        def ratio(part: str) -> float:
            return round(self.cpu_s[part, "first"] / max(1e-9, self.cpu_s[part, "again"]), 3)

        return {
            "way": self.name,
            "batches": self.batches["all"],
            "new_shapes": self.batches["new"],
            "cpu_ms_per_input": ms("all", "first"),
            "again_cpu_ms_per_input": ms("all", "again"),
            "first_over_again": ratio("all"),
            "new_first_cpu_ms_per_input": ms("new", "first"),
            "new_again_cpu_ms_per_input": ms("new", "again"),
            "new_first_over_again": ratio("new"),
            "seen_first_over_again": ratio("seen"),
            "kernels_per_batch": round(self.created["first"] / max(1, self.batches["all"]), 2),
            "again_kernels_per_batch": round(
                self.created["again"] / max(1, self.batches["all"]), 2
            ),
        }


def _ways(args: argparse.Namespace) -> list[Way]:
    """The engines: torch bfloat16 as served (whose bfloat16 model the padded way runs), then
    BACKEND=onnx and DTYPE=int8, each loaded and warmed as the server does."""
    from service.backends.openvino_backend import OpenVinoBackend
    from service.backends.torch_backend import TorchBackend
    from service.engine.forward.encoder import EncoderEngine
    from service.engine.loading.load import load_engine
    from service.engine.loading.warmup import warm_up
    from service.settings import Settings

    def loaded(**kw: Any) -> Any:
        engine = load_engine(Settings(torch_num_threads=args.threads, **kw))
        warm_up(engine)
        return engine

    def part(engine: Any, kind: type) -> Any:
        backend = engine.backend
        for b in (backend, getattr(backend, "large", None), getattr(backend, "small", None)):
            if isinstance(b, kind):
                return b
        raise SystemExit(f"no {kind.__name__} in {engine.info.backend_summary}")

    torch_engine = loaded(backend="torch", dtype="bfloat16")
    base = getattr(torch_engine.backend, "large", torch_engine.backend)

    def on(backend: Any) -> Any:
        return EncoderEngine(torch_engine.pipe, torch_engine.info, torch_engine.sentence, backend)

    padded = TorchBackend(base.model, base.device)
    onnx = loaded(backend="onnx", dtype="float32").backend
    int8 = part(loaded(dtype="int8"), OpenVinoBackend)
    ways = [
        Way("torch bfloat16, padded", on(padded)),
        Way("onnxruntime float32", on(onnx)),
        Way("OpenVINO int8 graph", on(int8)),
    ]
    if not args.no_openvino_float32:
        float32 = OpenVinoBackend(onnx.path, int(torch_engine.info.torch_threads), "float32")
        ways.append(Way("OpenVINO float32 graph", on(float32)))
    return ways


def measure(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["ONEDNN_VERBOSE"] = "profile_create"
    from loadtest.kernels import Creations

    counter = Creations()  # before torch loads: oneDNN prints to descriptor 1
    from loadtest.corpus import short_inputs
    from service.engine.jobs import Op, Unit
    from service.engine.params import EmbedParams

    ways = _ways(args)
    texts = [str(t) for t in short_inputs(args.n)]
    units = [Unit(op=Op.EMBED, text=t, params=EmbedParams(truncate=True)) for t in texts]
    arrival = [units[i : i + SIZE] for i in range(0, len(units), SIZE)]
    for k, batch in enumerate(arrival):
        for j in range(len(ways)):
            ways[(k + j) % len(ways)].run(batch, counter)
    widths = sorted({s[1] for s in ways[0].seen})
    return {"ways": [w.row() for w in ways], "inputs": len(units), "widths": widths}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['inputs']} short inputs, batches of {SIZE}; widths met: {result['widths']}",
        "",
        "| way | CPU ms/input, first run | again at once | first / again | batches of a new "
        "shape | their first / again | the others' | oneDNN kernels made a batch (again) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["ways"]:
        lines.append(
            f"| {r['way']} | {r['cpu_ms_per_input']} | {r['again_cpu_ms_per_input']} | "
            f"{r['first_over_again']} | {r['new_shapes']} of {r['batches']} | "
            f"{r['new_first_over_again']} | {r['seen_first_over_again']} | "
            f"{r['kernels_per_batch']} "
            f"({r['again_kernels_per_batch']}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="inputs of the short corpus")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: the server's)")
    parser.add_argument("--no-openvino-float32", action="store_true")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    result = measure(args)
    print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
