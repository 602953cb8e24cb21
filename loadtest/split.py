"""The paired rounds of the workloads: server points between limit points, what bounds them.

- :func:`paired_rounds`: each server point between two limit (b) points, and one client
  against direct calls, round after round;
- :func:`batches_alone`: the batches the server formed during a point (its ``batch`` log
  lines), replayed alone by the server's own ``Engine`` in a limit process;
- :func:`one_client_in_turn`: one client's latency against a direct single pipeline call on
  the same inputs, in turn by blocks.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from loadtest import client
from loadtest import limit as limit_mod
from loadtest.stats import percentile


async def paired_rounds(
    rounds: int,
    levels: Sequence[int],
    limit_b: Callable[[], tuple[float, float]],
    one_client: Callable[[], Awaitable[dict[str, float]]],
    point: Callable[[int], Awaitable[dict[str, Any]]],
    log: Path | None = None,
    worker: limit_mod.LimitWorker | None = None,
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Rounds of: ``one_client()`` (one client against direct calls, in turn), then limit (b)
    (``limit_b()``: inputs/s and the CPU share other processes took), and for each level a
    server point (``point(n)``, its ``inputs_per_s``) and limit (b) again, so that every server
    point sits between two limit points taken seconds apart: its ``ratio`` is server / mean of
    the two. With the server's ``log`` and the limit ``worker``, each point is also split into
    what bounds it (:func:`batches_alone`; ``over_alone``: server / its batches alone).
    Returns the points by level and the one-client rounds."""
    points: dict[int, list[dict[str, Any]]] = {n: [] for n in levels}
    ones: list[dict[str, Any]] = []
    for rnd in range(1, rounds + 1):
        ones.append(one := {**await one_client(), "round": rnd})
        print(
            f"  round {rnd}: one client p50 {one['p50_ms']:.1f} ms, direct call "
            f"{one['single_p50_ms']:.1f} ms",
            flush=True,
        )
        before, before_other = limit_b()
        for n in levels:
            offset = log.stat().st_size if log else 0
            got = await point(n)
            alone = batches_alone(log, offset, worker) if log and worker else {}
            after, after_other = limit_b()
            rate = float(got["inputs_per_s"])
            ratio = rate / statistics.fmean((before, after))
            over = rate / alone["alone_inputs_per_s"] if alone else math.nan
            points[n].append(
                {
                    **got,
                    **alone,
                    "round": rnd,
                    "limit_b_before": before,
                    "limit_b_after": after,
                    "limit_other_cpu": max(before_other, after_other),
                    "ratio": ratio,
                    "over_alone": over,
                }
            )
            print(
                f"  round {rnd}: limit (b) {before:.1f}, {n} clients {rate:.1f}, limit (b) "
                f"{after:.1f}: ratio {ratio:.2f}; its batches alone "
                f"{alone.get('alone_inputs_per_s', math.nan):.1f}/s (server / alone {over:.2f}),"
                f" forward under load {alone.get('forward_slowdown', math.nan):.2f}x, busy "
                f"{alone.get('busy', math.nan):.0%}",
                flush=True,
            )
            before, before_other = after, after_other
    return points, ones


def batches_alone(log: Path, offset: int, worker: limit_mod.LimitWorker) -> dict[str, Any]:
    """What bounds a server point, from its `batch` log lines (those written after ``offset``):

    - ``alone_inputs_per_s``: the same batch shapes run back to back by the server's own
      ``Engine.run`` in the limit process, with nothing else on the CPU: what the server's batch
      formation would give without HTTP (compare with limit (b));
    - ``forward_slowdown``: their summed ``inference_ms`` under load / the same alone (HTTP,
      encoding and the load client share the cores with the model);
    - ``busy``: the share of the point's span (first to last batch line) spent in batches.

    Empty when the log has no batch lines (``--server-cmd``)."""
    with log.open("rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    batches = [x for x in map(_json_line, lines) if x.get("event") == "batch"]
    if len(batches) < 2:
        return {}
    forward_s = sum(b["inference_ms"] for b in batches) / 1000
    shapes = [[b["size"], b["padded_tokens"] // b["size"]] for b in batches]
    alone_s = float(worker.ask(op="replay", shapes=shapes)["seconds"])
    stamps = [datetime.fromisoformat(b["timestamp"]) for b in (batches[0], batches[-1])]
    span_s = (stamps[1] - stamps[0]).total_seconds() + batches[0]["inference_ms"] / 1000
    return {
        "batches": len(batches),
        "batch_inputs": sum(b["size"] for b in batches),
        "padding_efficiency": sum(b["tokens"] for b in batches)
        / sum(b["padded_tokens"] for b in batches),
        "alone_inputs_per_s": sum(b["size"] for b in batches) / alone_s,
        "forward_slowdown": forward_s / alone_s,
        "busy": forward_s / span_s,
    }


def _json_line(raw: bytes) -> dict[str, Any]:
    """One JSON log line as a dict; {} for anything else (a console line, a line being written)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


async def one_client_in_turn(
    base: str, reqs: list[client.Request], worker: limit_mod.LimitWorker, n: int, block: int = 10
) -> dict[str, float]:
    """One client against a direct single call on the same inputs, in turn by blocks: the limit
    process makes direct calls on inputs k..k+block back to back, then one client sends the
    server the same inputs back to back, and so on over the first ``n`` inputs. The first call
    of each block (a cold start after the other side ran) is left out on both sides. Blocks
    take about 0.3 s, so both p50s come from the same inputs on a machine in the same state."""
    direct: list[float] = []
    served: list[float] = []
    async with client.session(1) as http:
        for start in range(0, min(n, len(reqs)), block):
            indices = list(range(start, min(start + block, n, len(reqs))))
            direct += worker.ask(op="calls", indices=indices)["ms"][1:]
            for k in indices:
                sent = time.perf_counter()
                if await client.send(http, base, reqs[k]) != 200:
                    raise RuntimeError(f"input {k} was not answered 200")
                if k != start:
                    served.append((time.perf_counter() - sent) * 1000)
    return {
        "p50_ms": percentile(served, 50),
        "single_p50_ms": percentile(direct, 50),
        "p99_ms": percentile(served, 99),
        "single_p99_ms": percentile(direct, 99),
        "added_ms_median": statistics.median(s - d for s, d in zip(served, direct, strict=True)),
        "n": len(served),
    }
