"""How much CPU other processes took during a measurement, and waiting for a quiet machine.

The client, the server and the limit share the cores; anything else running there slows the
server and the limit by different amounts and spoils the ratios. Every benchmark point records
the share of the machine's CPU that processes outside the benchmark's own tree used meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Wall clock (s), CPU seconds busy on the whole machine, used by our process tree, and
    used by the load side alone: this process (the load clients, the probes) and its children
    already waited for (wrk), not the servers it runs."""

    wall_s: float
    machine_busy_s: float
    own_s: float
    client_s: float


def _cpu_s() -> tuple[float, float]:
    """(our process tree's CPU seconds, the load side's: this process and its waited children)."""
    me = psutil.Process()
    times = me.cpu_times()  # includes children already waited for (the limit subprocess)
    client = times.user + times.system + times.children_user + times.children_system
    total = client
    for child in me.children(recursive=True):
        try:
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
        except psutil.Error:  # it exited between listing and reading
            pass
    return float(total), float(client)


def snapshot() -> Snapshot:
    """CPU counters now."""
    cpu = psutil.cpu_times()
    busy = sum(cpu) - cpu.idle - getattr(cpu, "iowait", 0.0)
    return Snapshot(time.monotonic(), busy, *_cpu_s())


def client_cores(before: Snapshot, after: Snapshot) -> float:
    """Cores the load side used between two snapshots: on 2 shared cores they are taken from
    the server, so goodput against a cheaper capacity run reads low by about that much."""
    return (after.client_s - before.client_s) / max(after.wall_s - before.wall_s, 1e-9)


def foreign_share(before: Snapshot, after: Snapshot) -> float:
    """Share (0-1) of the machine's CPU capacity used by other processes between two snapshots.

    Children that exit without being waited for are not counted as ours, so the figure can only
    overstate foreign use, never hide it.
    """
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    foreign = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, foreign / (wall * (psutil.cpu_count() or 1)))


def wait_quiet(max_wait_s: float, below: float = 0.10, calm_s: float = 5.0) -> float:
    """Wait until the machine's CPU use stays under ``below`` (0-1) for ``calm_s`` seconds.

    Gives up after ``max_wait_s``; returns the seconds waited. Meant to run before anything of
    the benchmark's own is running.
    """
    start = time.monotonic()
    calm_since = start
    while time.monotonic() - start < max_wait_s:
        if psutil.cpu_percent(interval=1.0) / 100 >= below:
            calm_since = time.monotonic()
        elif time.monotonic() - calm_since >= calm_s:
            break
    return time.monotonic() - start


@dataclass(frozen=True, slots=True)
class Quiet:
    """Retry policy for points spoiled by other processes.

    A point during which other processes used more than ``max_other_cpu`` (0-1) of the machine
    is measured again, after waiting up to ``wait_s`` for quiet, at most ``retries`` times; the
    attempt with the least foreign CPU is kept.
    """

    max_other_cpu: float = 0.10
    retries: int = 2
    wait_s: float = 30.0


def least_disturbed(measure: Callable[[], T], quiet: Quiet) -> tuple[T, float, int]:
    """Run ``measure`` under ``quiet``; returns (result, its foreign CPU share, attempts made)."""
    best: tuple[T, float] | None = None
    attempts = 0
    for attempts in range(1, quiet.retries + 2):
        before = snapshot()
        result = measure()
        share = foreign_share(before, snapshot())
        if best is None or share < best[1]:
            best = (result, share)
        if share <= quiet.max_other_cpu or attempts > quiet.retries:
            break
        wait_quiet(quiet.wait_s)
    assert best is not None
    return best[0], best[1], attempts


async def least_disturbed_async(
    measure: Callable[[], Awaitable[dict[str, Any]]], quiet: Quiet
) -> dict[str, Any]:
    """The async form for the load client: the kept summary gets ``other_cpu`` and ``attempts``."""
    best: dict[str, Any] | None = None
    for attempt in range(1, quiet.retries + 2):
        before = snapshot()
        point = await measure()
        point["other_cpu"], point["attempts"] = foreign_share(before, snapshot()), attempt
        if best is None or point["other_cpu"] < best["other_cpu"]:
            best = point
        if point["other_cpu"] <= quiet.max_other_cpu or attempt > quiet.retries:
            break
        await asyncio.to_thread(wait_quiet, quiet.wait_s)
    assert best is not None
    best["attempts"] = point["attempts"]
    return best
