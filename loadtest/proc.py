"""The server's worker process seen from ``/proc``: its threads' CPU by role.

The worker (gunicorn's one child) has threads in three roles: ``loop``, its main thread (the
event loop); ``inference``, the thread the batcher names so (py-spy's ``dump`` reads Python's
thread names, which the OS does not see); ``other``, torch's OpenMP pool and idle native
threads. CPU comes from ``/proc/<pid>/task/<tid>/schedstat``: nanoseconds on a CPU, and
nanoseconds runnable but waiting for one.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

_PROC = Path("/proc")


def worker_pid(master_pid: int, timeout_s: float = 30.0) -> int:
    """The pid of gunicorn's (only) worker under ``master_pid``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(master_pid).children()
            if children:
                return int(children[0].pid)
        time.sleep(0.1)
    raise RuntimeError(f"no worker process under {master_pid}")


def python_threads(pid: int, py_spy: str) -> dict[int, str]:
    """Thread id -> Python thread name, from ``py-spy dump --json`` (one brief sample)."""
    out = subprocess.run(
        [py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return {
        int(t["os_thread_id"]): str(t.get("thread_name") or "")
        for t in json.loads(out)  # one object per thread
        if t.get("os_thread_id") is not None
    }


@dataclass(frozen=True, slots=True)
class ThreadTimes:
    """Nanoseconds one thread spent on a CPU, and runnable waiting for one."""

    run_ns: int
    wait_ns: int


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Every thread of ``pid`` now (threads that exit meanwhile are skipped)."""
    out: dict[int, ThreadTimes] = {}
    for task in (_PROC / str(pid) / "task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            run, wait, _ = (task / "schedstat").read_text().split()
            out[int(task.name)] = ThreadTimes(int(run), int(wait))
    return out


def roles(pid: int, names: dict[int, str]) -> dict[int, str]:
    """Thread id -> role (module docstring) for the threads of ``pid`` now."""
    inference = {tid for tid, name in names.items() if name == "inference"}
    return {
        tid: "loop" if tid == pid else "inference" if tid in inference else "other"
        for tid in thread_times(pid)
    }


@dataclass(frozen=True, slots=True)
class CpuSplit:
    """CPU seconds per role over a window of ``wall_s``, and seconds runnable but waiting."""

    wall_s: float
    cpu_s: dict[str, float]
    runnable_s: dict[str, float]

    def summary(self, requests: int, inputs: int) -> dict[str, float]:
        """The figures the benchmark prints: ms of loop CPU per request, ms of inference-thread
        and torch-pool CPU per input, cores used by each role, and cores' worth of time each role
        was runnable but waited for a CPU (schedstat's second field)."""
        cpu = self.cpu_s
        return {
            "loop_ms_per_request": 1000 * cpu.get("loop", 0.0) / max(1, requests),
            "inference_ms_per_input": 1000 * cpu.get("inference", 0.0) / max(1, inputs),
            "other_ms_per_input": 1000 * cpu.get("other", 0.0) / max(1, inputs),
            **{f"{role}_cores": s / self.wall_s for role, s in cpu.items()},
            "loop_runnable_share": self.runnable_s.get("loop", 0.0) / self.wall_s,
            # cores' worth of time each role was runnable but waited for a CPU
            **{f"{role}_waiting_cores": s / self.wall_s for role, s in self.runnable_s.items()},
        }


class CpuWindow:
    """Per-role CPU of a worker between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int, names: dict[int, str]) -> None:
        self.pid, self.names = pid, names
        self._before: dict[int, ThreadTimes] = {}
        self._started = 0.0

    def start(self) -> None:
        self._before = thread_times(self.pid)
        self._started = time.monotonic()

    def stop(self) -> CpuSplit:
        wall = time.monotonic() - self._started
        after = thread_times(self.pid)
        role = roles(self.pid, self.names)
        cpu: dict[str, float] = {}
        runnable: dict[str, float] = {}
        for tid, now in after.items():
            then = self._before.get(tid, ThreadTimes(0, 0))
            name = role.get(tid, "other")
            cpu[name] = cpu.get(name, 0.0) + (now.run_ns - then.run_ns) / 1e9
            runnable[name] = runnable.get(name, 0.0) + (now.wait_ns - then.wait_ns) / 1e9
        return CpuSplit(wall, cpu, runnable)
