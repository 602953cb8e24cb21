"""The server's worker process seen from ``/proc``: its threads' CPU, its RSS, the loop's waits.

gunicorn's master is the process the benchmark starts; the uvicorn worker (one) is its child.
Its threads, by role:

- ``loop``: the worker's main thread (thread id = process id), the asyncio event loop;
- ``inference``: the thread the batcher names so (found by py-spy's ``dump``, which reads the
  Python thread names; Python 3.11 does not give them to the OS);
- ``other``: every other thread: torch's OpenMP pool (the inference thread is its first
  member; the pool adds ``threads - 1``) and a few idle native threads.

CPU comes from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on CPU, and nanoseconds
runnable but waiting for a core), exact where ``stat``'s ticks are 10 ms.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

_PROC = Path("/proc")
# x86_64 (and arm64 for the first two: futex 98, epoll_pwait 22): the syscalls a blocked
# event-loop thread sits in.
_FUTEX = {"202", "98"}
_EPOLL = {"232", "281", "441", "22"}


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


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` now."""
    return int(psutil.Process(pid).memory_info().rss)


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
    """CPU seconds per role over a window of ``wall_s``, and the loop's waits (shares 0-1)."""

    wall_s: float
    cpu_s: dict[str, float]
    runnable_s: dict[str, float]
    loop_states: dict[str, float]

    def summary(self, requests: int, inputs: int) -> dict[str, float]:
        """The figures the benchmark prints: ms of loop CPU per request, ms of inference-thread
        and torch-pool CPU per input, cores used by each role, cores' worth of time each role
        was runnable but waited for a CPU (schedstat's second field), and the loop's states."""
        cpu = self.cpu_s
        out = {
            "loop_ms_per_request": 1000 * cpu.get("loop", 0.0) / max(1, requests),
            "inference_ms_per_input": 1000 * cpu.get("inference", 0.0) / max(1, inputs),
            "other_ms_per_input": 1000 * cpu.get("other", 0.0) / max(1, inputs),
            **{f"{role}_cores": s / self.wall_s for role, s in cpu.items()},
            "loop_runnable_share": self.runnable_s.get("loop", 0.0) / self.wall_s,
            # cores' worth of time each role was runnable but waited for a CPU
            **{f"{role}_waiting_cores": s / self.wall_s for role, s in self.runnable_s.items()},
        }
        out.update({f"loop_{state}_share": share for state, share in self.loop_states.items()})
        return out


class CpuWindow:
    """Per-role CPU of a worker between :meth:`start` and :meth:`stop`, with the loop's state
    sampled meanwhile (:class:`LoopSampler`)."""

    def __init__(self, pid: int, names: dict[int, str], sample_hz: float = 200.0) -> None:
        self.pid, self.names = pid, names
        self.sampler = LoopSampler(pid, sample_hz)
        self._before: dict[int, ThreadTimes] = {}
        self._started = 0.0

    def start(self) -> None:
        self._before = thread_times(self.pid)
        self._started = time.monotonic()
        self.sampler.start()

    def stop(self) -> CpuSplit:
        states = self.sampler.stop()
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
        return CpuSplit(wall, cpu, runnable, states)


class LoopSampler:
    """Samples what the event-loop thread is doing, ``hz`` times a second, in a thread here.

    ``/proc/<pid>/task/<pid>/syscall`` says ``running`` (on a CPU, or runnable), else the
    syscall the thread is blocked in: ``epoll`` (idle, waiting for sockets or timers), ``futex``
    (waiting for a lock: in this process almost always the GIL, which Python 3.11 waits for on
    a condition variable; also the queue's and the log handler's locks, held briefly), or
    ``other``. The futex share is therefore an upper bound on the time the loop had work but
    waited for the GIL. Reading the file does not stop the thread (2 us a sample here).
    """

    def __init__(self, pid: int, hz: float = 200.0, max_samples: int = 1_000_000) -> None:
        self.path = _PROC / str(pid) / "task" / str(pid) / "syscall"
        self.interval, self.max_samples = 1 / hz, max_samples
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, float]:
        """Stop; each state's share of the samples (empty when none could be read)."""
        self._stop.set()
        self._thread.join(5)
        total = sum(self.counts.values())
        return {state: n / total for state, n in sorted(self.counts.items())} if total else {}

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # not readable here (no ptrace rights): no states
        try:
            while not self._stop.wait(self.interval) and self.counts.total() < self.max_samples:
                try:
                    first = os.pread(fd, 64, 0).split(maxsplit=1)
                except OSError:
                    return  # the process exited
                self.counts[classify(first[0].decode() if first else "")] += 1
        finally:
            os.close(fd)


def classify(syscall: str) -> str:
    """The state of a thread from the first field of its ``/proc/.../syscall``."""
    if syscall == "running":
        return "running"
    if syscall in _FUTEX:
        return "futex"
    if syscall in _EPOLL:
        return "epoll"
    return "other"
