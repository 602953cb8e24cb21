"""The benchmark's workloads, one module each; ``loadtest.bench`` runs them in ``ORDER``.

| name | what it measures |
| --- | --- |
| ``mixed`` | the mixed-input bench: limit, closed levels, paired rounds, overload, seed baseline |
| ``short_inputs`` | short inputs (embeddings, classification): wrk levels, paired with limit (b) |
| ``cpu`` | CPU per request on the loop and per input in the inference thread; GIL shares |
| ``profile`` | py-spy: where the loop's and the inference thread's CPU goes (32 clients) |
| ``burst`` | 160 requests at once on a busy server: shed and /livez latency beside the floor |
| ``storm`` | a retry storm (256 clients resending on 503): goodput against capacity, A/B |
| ``memory`` | RSS during a long storm and a long open-loop overload |
| ``zero_shot`` | zero-shot classification: latency and throughput per candidate label |

Each module has ``add_arguments(parser)``, ``finish_arguments(args, results)``, ``run(args)``
(returns a JSON-friendly dict) and ``table(result)`` (Markdown).
"""

from __future__ import annotations

from types import ModuleType

from loadtest.workloads import (
    burst,
    cpu_split,
    memory,
    mixed,
    profile,
    short_inputs,
    storm,
    zero_shot,
)

WORKLOADS: dict[str, ModuleType] = {
    m.NAME: m for m in (mixed, short_inputs, cpu_split, profile, burst, storm, memory, zero_shot)
}
ORDER: tuple[str, ...] = tuple(WORKLOADS)
