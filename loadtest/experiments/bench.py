"""The studies of ``loadtest.experiments`` that are workloads, run as the benchmark runs its own.

python -m loadtest.experiments.bench --only memory --minutes 2
"""

from __future__ import annotations

from types import ModuleType

from loadtest import bench
from loadtest.experiments import (
    batch_tokens,
    burst,
    cpu_split,
    memory,
    pooled,
    profile,
    zero_shot,
)

WORKLOADS: dict[str, ModuleType] = {
    m.NAME: m for m in (cpu_split, profile, burst, memory, zero_shot, pooled, batch_tokens)
}

if __name__ == "__main__":
    bench.main(workloads=WORKLOADS)
