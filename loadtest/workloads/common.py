"""What the workloads share: request bodies, the server's environment, a measured wrk point."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from loadtest import cpu, proc, servers, wrk
from loadtest import limit as limit_mod

JSON = "application/json"


def json_body(text: str, *, truncate: bool = False) -> bytes:
    """``{"inputs": text}``: the Hugging Face Inference API shape, one input (no raw newline:
    JSON escapes it, so the body fits one line of wrk's body file); ``truncate`` adds
    ``parameters.truncation`` (every task takes it)."""
    doc: dict[str, object] = {"inputs": text}
    if truncate:
        doc["parameters"] = {"truncation": True}
    return json.dumps(doc).encode()


def quiet(args: argparse.Namespace) -> cpu.Quiet:
    """The retry policy for points disturbed by other processes (``--max-other-cpu``)."""
    return cpu.Quiet(args.max_other_cpu, args.retries)


def server_env(args: argparse.Namespace, **fixed: str) -> dict[str, str]:
    """The workload's own settings (``fixed``), then ``--env`` on top (the user's word wins)."""
    return {**fixed, **servers.parse_env(args.env)}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_json(url: str) -> Any:
    """GET ``url`` and decode its JSON body (None when it fails: e.g. no /info)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def model_info(served: servers.Served) -> dict[str, Any]:
    """The ``model`` part of the server's /info ({} when it cannot be read)."""
    info = get_json(served.base + "/info")
    model = info.get("model") if isinstance(info, dict) else None
    return model if isinstance(model, dict) else {}


def thread_names(served: servers.Served) -> dict[int, str]:
    """The worker's Python thread names by thread id (py-spy dump); {} without py-spy, so
    the inference thread then counts among ``other`` (say so once)."""
    try:
        return proc.python_threads(served.worker_pid, servers.console_script("py-spy"))
    except Exception as exc:  # not installed, or it failed to read the process
        print(f"  (no thread names: {exc}; the inference thread counts as 'other')", flush=True)
        return {}


def wrk_point(
    served: servers.Served,
    bodies: Sequence[bytes],
    connections: int,
    seconds: float,
    names: dict[int, str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One closed-loop wrk point on ``POST /`` with the worker's per-thread CPU over it
    (``loadtest.proc``); measured again when other processes took the CPU (``quiet``). One
    input per request."""

    def measure() -> dict[str, Any]:
        window = proc.CpuWindow(served.worker_pid, names)
        window.start()
        try:
            res = wrk.run(served.base + "/", bodies, connections, seconds)
        finally:
            split = window.stop()
        return {**res.summary(), **split.summary(res.requests, res.ok)}

    point, other, attempts = cpu.least_disturbed(measure, quiet(args))
    return {**point, "other_cpu": other, "attempts": attempts}


def limit_b(
    worker: limit_mod.LimitWorker, batch_size: int, args: argparse.Namespace, **extra: Any
) -> tuple[float, float]:
    """One whole pass of limit (b) at ``batch_size`` in the worker: (inputs/s, the share of the
    CPU other processes took meanwhile); re-measured when disturbed."""

    def one() -> float:
        return float(worker.ask(op="b", batch_size=batch_size, **extra)["inputs_per_s"])

    rate, other, _ = cpu.least_disturbed(one, quiet(args))
    return rate, other


def ints(text: str) -> list[int]:
    """A comma list of integers (``--levels 1,8,32``)."""
    return [int(x) for x in text.split(",")]


def median(values: Iterable[float]) -> float:
    """The median, NaN when there is nothing."""
    got = list(values)
    return statistics.median(got) if got else float("nan")


def ms(value: Any) -> str:
    """A figure for a table: one decimal, "-" when missing or NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.1f}"


def cpu_cells(point: dict[str, Any]) -> str:
    """The CPU columns of a point: loop ms per request, inference and torch-pool ms per input,
    other processes' CPU."""
    return (
        f"{point['loop_ms_per_request']:.2f} | {point['inference_ms_per_input']:.2f} | "
        f"{point['other_ms_per_input']:.2f} | {point['other_cpu']:.0%}"
    )


CPU_HEAD = "loop ms/req | inference ms/input | torch pool ms/input | other CPU"
