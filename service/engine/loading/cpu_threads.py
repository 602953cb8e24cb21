"""How many CPU threads torch may use: the container's CPU quota, not the host's core count.

A pod limited to 2 CPUs on a 64-core node that runs 64 intra-op threads is throttled by the CFS
quota and gets slower, not faster (see the PyTorch CPU performance notes on oversubscription).
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from pathlib import Path

from service.settings import library_defaults

_CGROUP = Path("/sys/fs/cgroup")


def _quota_v2(root: Path) -> float | None:
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(root: Path) -> float | None:
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((root / folder / "cpu.cfs_quota_us").read_text())
            period = int((root / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota <= 0 else quota / period
    return None


def cpu_quota(root: Path = _CGROUP) -> float | None:
    """CPUs allowed by the cgroup (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); None if unlimited."""
    quota = _quota_v2(root)
    return quota if quota is not None else _quota_v1(root)


def default_torch_threads(root: Path = _CGROUP) -> int:
    """Intra-op threads: ceil(CPU quota), at most the CPUs this process may run on, at least 1."""
    usable = len(os.sched_getaffinity(0))
    quota = cpu_quota(root)
    return max(1, min(usable, math.ceil(quota)) if quota is not None else usable)


# How long torch's intra-op threads (libgomp, which the CPU wheels ship) spin after a parallel
# region before they sleep. libgomp's default, 300,000 spins (about 3 ms), keeps both threads
# spinning through the idle time between lone requests: one input every 100 ms cost the worker
# several times the forward's CPU, billed by the CPU quota and read as load by CPU-based
# autoscaling. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a wake-up at each of a forward's
# dozens of regions: 0.78x the throughput under load. 2,000 spins (tens of microseconds) bridge
# the gaps between a forward's regions and sleep soon after it ends: the throughput of spinning,
# nearly the idle CPU of sleeping; 10,000 spun long enough beside onnxruntime's lone inputs to
# triple the interactive p99 at light load (docs/benchmarks.md, Serving cost). Read when libgomp
# loads (torch's import), so set in the environment before the worker starts; an operator's
# OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
SPIN_COUNT = "2000"


def set_openmp_wait(environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in ``environ`` (default ``os.environ``)
    unless it sets ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` itself."""
    library_defaults({"GOMP_SPINCOUNT": SPIN_COUNT}, unless=("OMP_WAIT_POLICY",), environ=environ)
