"""RSS of each backend over a soak of changing batch shapes.

    python -m loadtest.experiments.soak [--minutes 10] [--interval 10] [--backends torch:float32]

Each backend runs in a process of its own, built as the server builds it (`load_engine` with
BACKEND/DTYPE; `auto` is the default server's choice, small batches routed included): batches
of a random size (1 to MAX_BATCH_SIZE inputs, the server's bound: 64 by default) of the
mixed-length corpus (8 to 256 tokens: every batch a new (B, L) shape), one after another
through `prepare_many` + `run`, the server's own path, for `--minutes`. Its RSS is sampled
every `--interval` seconds. The processes run side by side, each with `--threads` torch
threads (memory, not speed, is measured here). Prints a markdown table: RSS after the first
batch, at half time and at the end, and the growth over the second half (target: within 5%,
as for the server under a storm: `loadtest.workloads.memory`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = "auto:auto,torch:float32,torch:bfloat16,onnx:float32"
GROWTH_TARGET = 0.05
_MARK = "soak: "  # a child's result line (its other output is the server's log)


def soak(backend: str, dtype: str, minutes: float, interval_s: float, threads: int) -> dict:
    """One backend's soak in this process: RSS samples (seconds, MB) and the batches run."""
    import psutil

    from loadtest.corpus import mixed_inputs
    from service.engine.jobs import Op, Unit
    from service.engine.loading.load import load_engine
    from service.engine.params import EmbedParams
    from service.settings import Settings

    settings = Settings(backend=backend, dtype=dtype, torch_num_threads=threads)  # type: ignore[arg-type]
    engine = load_engine(settings)
    texts = mixed_inputs(2000, seed=1)
    rng = random.Random(0)
    me = psutil.Process()
    CUT = EmbedParams(truncate=True)

    def one_batch() -> None:
        batch = rng.sample(texts, rng.randint(1, settings.max_batch_size))
        engine.run(engine.prepare_many([Unit(op=Op.EMBED, text=t, params=CUT) for t in batch]))

    one_batch()
    started = time.monotonic()
    samples = [(0.0, me.memory_info().rss / 1e6)]
    batches, next_at = 1, started + interval_s
    while (now := time.monotonic()) - started < minutes * 60:
        one_batch()
        batches += 1
        if now >= next_at:
            samples.append((round(now - started, 1), me.memory_info().rss / 1e6))
            next_at += interval_s
    samples.append((round(time.monotonic() - started, 1), me.memory_info().rss / 1e6))
    served = f"{engine.info.backend} {engine.info.dtype}"
    small = engine.info.backend_summary.get("small_batches")
    if small:
        served += (
            f" (+ {small['backend']} {small['dtype']} up to {small['max_padded_tokens']} tokens)"
        )
    return {"asked": f"{backend}:{dtype}", "served": served, "batches": batches, "rss_mb": samples}


def at(samples: list[list[float]], t: float) -> float:
    """The RSS sample nearest to `t` seconds."""
    return min(samples, key=lambda s: abs(s[0] - t))[1]


def table(rows: list[dict[str, Any]], minutes: float) -> str:
    half, end = minutes * 30, minutes * 60
    lines = [
        f"| asked | served | batches | RSS MB after 1 batch | at {minutes / 2:g} min "
        f"| at {minutes:g} min | growth {minutes / 2:g}-{minutes:g} min |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s = r["rss_mb"]
        mid, last = at(s, half), at(s, end)
        growth = (last - mid) / mid
        verdict = "ok" if growth <= GROWTH_TARGET else "over 5%"
        lines.append(
            f"| {r['asked']} | {r['served']} | {r['batches']} | {s[0][1]:.0f} | {mid:.0f} | "
            f"{last:.0f} | {growth:+.1%} ({verdict}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--backends", default=BACKENDS, help="BACKEND:DTYPE pairs, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: BACKEND:DTYPE
    args = parser.parse_args()
    if args.one:
        backend, dtype = args.one.split(":")
        print(_MARK + json.dumps(soak(backend, dtype, args.minutes, args.interval, args.threads)))
        return
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadtest.experiments.soak",
                "--one",
                pair,
                "--minutes",
                str(args.minutes),
                "--interval",
                str(args.interval),
                "--threads",
                str(args.threads),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for pair in args.backends.split(",")
    ]
    rows = []
    for child in children:
        out, _ = child.communicate(timeout=args.minutes * 60 + 600)
        (line,) = [x for x in out.splitlines() if x.startswith(_MARK)]
        rows.append(json.loads(line.removeprefix(_MARK)))
    for r in rows:
        print(json.dumps(r))
    print(table(rows, args.minutes))


if __name__ == "__main__":
    main()
