"""How many CPU threads torch may use: the container's CPU quota, not the host's core count.

A pod limited to 2 CPUs on a 64-core node that runs 64 intra-op threads is throttled by the CFS
quota and gets slower, not faster (see the PyTorch CPU performance notes on oversubscription).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

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


# OpenMP's wait policy for torch's intra-op threads (libgomp, which the CPU wheels ship). Unset,
# each thread spins up to ~300,000 iterations after every parallel region before it sleeps, and
# a forward is dozens of regions: one input alone every 100 ms kept both threads spinning
# through the forward, so the worker's CPU per request was several times the forward's own
# (docs/backends.md, Threads). PASSIVE puts them to sleep at once; a region then wakes them
# (a futex each), a cost that batches amortize. Read when libgomp loads (torch's import), so set
# in the environment before the worker starts; the environment's own value wins.
OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}


def set_openmp_wait(environ: dict[str, str] | None = None) -> None:
    """Put :data:`OPENMP_WAIT` into ``environ`` (default ``os.environ``) where it is unset."""
    target = os.environ if environ is None else environ
    for name, value in OPENMP_WAIT.items():
        target.setdefault(name, value)
