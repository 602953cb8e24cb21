"""Start a server under test in a subprocess on a free loopback port, and stop it.

Used by the benchmark and by the Locust smoke tests. The process gets its own session so that
stopping it (SIGTERM, then SIGKILL after a grace period) reaches gunicorn's worker too.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[1]


_handed_out: set[int] = set()
_pick = random.Random()  # its own generator: a test seeding `random` picks nothing here
_LOWEST = 10_000  # below: well-known and registered servers' ports


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux `net.ipv4.ip_local_port_range`), from which
    every socket's bind(0) and connect() draw their ports; Linux's default if unreadable."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server started next to bind: never one
    handed out before, and from below the kernel's ephemeral range, which any socket's bind(0)
    or connect() may take meanwhile. Falls back to bind(0) where nothing below is free."""
    low, _ = _ephemeral_range()
    if low - _LOWEST > 1000:
        for _ in range(100):
            port = _pick.randrange(_LOWEST, low)
            if port not in _handed_out and _is_free(port):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def console_script(name: str) -> str:
    """The path of a console script installed beside this Python, else on PATH; else raise."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"console script {name!r} is not installed (pip install -e .)")
    return found


def pipeline_server_command() -> list[str]:
    """The real server: the ``pipeline-server`` console script (gunicorn, one worker)."""
    return [console_script("pipeline-server")]


def seed_server_command(port: int) -> list[str]:
    """The baseline: ``loadtest.seed_server`` under uvicorn, one process."""
    options = f"--host {HOST} --port {port} --log-level warning --no-access-log"
    return [sys.executable, "-m", "uvicorn", "loadtest.seed_server:app", *options.split()]


def wait_ready(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``url`` every 0.2 s until it answers 200; raise after ``timeout_s`` or if proc
    dies (RuntimeError, with the last lines of the server's ``log`` where one is given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = f"; its log ends:\n{log_tail(log)}" if log is not None else ""
            raise RuntimeError(f"server exited with code {proc.returncode} before ready{said}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(url, timeout=2) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready within {timeout_s:g} s")


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of the file at `path` (or why it could not be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"({path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def started(
    command: list[str],
    port: int,
    env: Mapping[str, str] | None = None,
    ready_path: str = "/readyz",
    ready_timeout_s: float = 180.0,
    log: IO[bytes] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``command`` (serving on ``port``) until the block ends; yields its base URL and the
    process. The environment gets HOST, PORT, HF_HUB_OFFLINE=1 and TOKENIZERS_PARALLELISM=false
    on top of ``env`` (or of this process's environment). Output goes to ``log`` (default:
    discarded)."""
    full_env = {
        **(env if env is not None else os.environ),
        "HOST": HOST,
        "PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    sink = log if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        command, env=full_env, stdout=sink, stderr=sink, cwd=REPO_ROOT, start_new_session=True
    )
    base = f"http://{HOST}:{port}"
    try:
        name = getattr(log, "name", None)  # a file's path, where `log` is an open file
        log_path = Path(name) if isinstance(name, str) else None
        wait_ready(base + ready_path, ready_timeout_s, proc, log_path)
        yield base, proc
    finally:
        stop(proc)


@dataclass(frozen=True, slots=True)
class Served:
    """A running pipeline-server: its base URL, gunicorn's pid, the worker's pid, its log."""

    base: str
    master_pid: int
    worker_pid: int
    log: Path
    env: dict[str, str]


@contextlib.contextmanager
def pipeline_server(
    env: Mapping[str, str], log: Path, ready_timeout_s: float = 180.0
) -> Iterator[Served]:
    """The real console script on a free port with ``env`` on top of this process's
    environment (JSON logs, so the benchmark can read its ``batch`` lines), until the block
    ends. The worker's pid is that of gunicorn's one child (``loadtest.proc``)."""
    from loadtest.proc import worker_pid

    full = {**os.environ, "LOG_FORMAT": "json", **env}
    with (
        log.open("wb") as sink,
        started(pipeline_server_command(), free_port(), full, log=sink) as (base, proc),
    ):
        yield Served(base, proc.pid, worker_pid(proc.pid), log, dict(env))


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` as a dict (``--env`` and ``--ab`` options); raise on a bad pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def stop(proc: subprocess.Popen[bytes], grace_s: float = 40.0) -> int:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()
