"""Where the server's CPU goes per request: the loop, the inference thread, torch's pool, the GIL.

``python -m loadtest.experiments.bench --only cpu`` (about 2 minutes). For each model (the
default one, answering token rows: large answers; the MiniLM classifier, answering labels: small
ones) and each input set (short: about 42 tokens; mixed: about 97), one wrk point at
``--cpu-clients`` (32) with:

- the worker's per-thread CPU (``loadtest.proc``): ms of CPU per request on the event loop, and
  per input in the inference thread and in torch's other OpenMP threads;
- the loop's state, sampled at 200 Hz: running (or runnable), idle in epoll, or blocked on a
  futex: waiting for the GIL (or, briefly, another lock) while it has work;
- py-spy ``--gil`` at 100 Hz: the share of the time each Python thread held the GIL.

Client and server share the 2 cores, and py-spy costs a few percent of one, so the figures are
shares of a machine that is itself the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest import corpus, models, servers, wrk
from loadtest import limit as limit_mod
from loadtest.experiments import pyspy
from loadtest.workloads import common

NAME = "cpu"
RATE = 100
# x86_64 (and arm64 for the first two: futex 98, epoll_pwait 22): the syscalls a blocked
# event-loop thread sits in.
_FUTEX = {"202", "98"}
_EPOLL = {"232", "281", "441", "22"}


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--cpu-clients", type=int, default=32, help="wrk connections per point")
    p.add_argument("--cpu-seconds", type=int, help="seconds per point (default 8, quick 4)")
    p.add_argument("--cpu-no-gil", action="store_true", help="skip py-spy's GIL record")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.cpu_seconds = args.cpu_seconds or (4 if args.quick else 8)


def _classifier() -> str:
    return str(models.minilm_classifier())


def _short() -> list[str]:
    return corpus.short_inputs(500)


def _mixed() -> list[str]:
    return corpus.mixed_inputs(512)


MODELS: dict[str, Callable[[], str]] = {
    "token rows": limit_mod.default_model,
    "labels": _classifier,
}
INPUTS: dict[str, Callable[[], list[str]]] = {"short": _short, "mixed": _mixed}


def gil_shares(stacks: list[pyspy.Stack], seconds: float) -> dict[str, float]:
    """Each thread's share of the time holding the GIL (samples / (rate x seconds))."""
    return {name: n / (RATE * seconds) for name, n in pyspy.per_thread(stacks).items()}


def point(
    srv: servers.Served, bodies: list[bytes], names: dict[int, str], args: argparse.Namespace
) -> dict[str, Any]:
    """One wrk point, with the loop's states sampled and py-spy's GIL record running over the
    same seconds (``loop_<state>_share``, ``gil``)."""
    rec = None if args.cpu_no_gil else pyspy.Recording(srv.worker_pid, args.cpu_seconds, gil=True)
    sampler = LoopSampler(srv.worker_pid)
    sampler.start()
    try:
        res = common.wrk_point(srv, bodies, args.cpu_clients, args.cpu_seconds, names, args)
    finally:
        states = sampler.stop()
    res.update({f"loop_{state}_share": share for state, share in states.items()})
    if rec is not None:
        res["gil"] = gil_shares(rec.stacks(), args.cpu_seconds)
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    rows: list[dict[str, Any]] = []
    for answer, model in MODELS.items():
        env = common.server_env(args, MODEL_ID=model())
        with servers.pipeline_server(
            env, args.results / f"{NAME}-{answer.replace(' ', '-')}.log"
        ) as srv:
            names = common.thread_names(srv)
            for inputs, texts in INPUTS.items():
                bodies = [common.json_body(t) for t in texts()]
                wrk.run(srv.base + "/", bodies, 8, 2)  # warm up
                res = point(srv, bodies, names, args)
                rows.append({"answers": answer, "inputs": inputs, **res})
                print(
                    f"  {answer}, {inputs} inputs: {res['ok_per_s']:.1f}/s; loop "
                    f"{res['loop_ms_per_request']:.2f} ms/req, inference "
                    f"{res['inference_ms_per_input']:.2f} + pool "
                    f"{res['other_ms_per_input']:.2f} ms/input; loop on futex "
                    f"{res.get('loop_futex_share', float('nan')):.0%}; GIL {res.get('gil', {})}",
                    flush=True,
                )
    return {"rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Per-thread CPU at {result['args'].get('cpu_clients')} wrk connections (ms of CPU; "
        "cores = CPU seconds per second; loop states from 200 Hz samples; GIL from py-spy):",
        "",
        "| answers | inputs | inputs/s | loop ms/req | inference ms/input | torch pool ms/input "
        "| loop cores | inference cores | pool cores | loop running / epoll / futex "
        "| GIL held: loop / inference | other CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        gil = r.get("gil", {})
        lines.append(
            f"| {r['answers']} | {r['inputs']} | {r['ok_per_s']:.1f} | "
            f"{r['loop_ms_per_request']:.2f} | {r['inference_ms_per_input']:.2f} | "
            f"{r['other_ms_per_input']:.2f} | {r.get('loop_cores', 0):.2f} | "
            f"{r.get('inference_cores', 0):.2f} | {r.get('other_cores', 0):.2f} | "
            f"{r.get('loop_running_share', 0):.0%} / {r.get('loop_epoll_share', 0):.0%} / "
            f"{r.get('loop_futex_share', 0):.0%} | "
            f"{gil.get('MainThread', 0):.0%} / {gil.get('inference', 0):.0%} | "
            f"{r['other_cpu']:.0%} |"
        )
    return "\n".join(lines)


class LoopSampler:
    """Samples what the event-loop thread is doing, ``hz`` times a second, in a thread here.

    ``/proc/<pid>/task/<pid>/syscall`` says ``running`` (on a CPU, or runnable), else the
    syscall the thread is blocked in: ``epoll`` (idle, waiting for sockets or timers), ``futex``
    (waiting for a lock: in this process almost always the GIL, which Python 3.11 waits for on
    a condition variable; also the queue's and the log handler's locks, held briefly), or
    ``other``. The futex share is therefore an upper bound on the time the loop had work but
    waited for the GIL. Reading the file does not stop the thread.
    """

    def __init__(self, pid: int, hz: float = 200.0, max_samples: int = 1_000_000) -> None:
        self.path = f"/proc/{pid}/task/{pid}/syscall"
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
