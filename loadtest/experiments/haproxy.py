"""HAProxy (Debian's package) in front of several replicas on 127.0.0.1, started and stopped
by the caller, driven through its runtime API.

HAProxy stands in for a Kubernetes Service: it health-checks each replica's `/readyz` (as the
kubelet's readiness probe drives the endpoints kube-proxy follows), and `set_state(name,
"maint")` takes a replica out at once, as the endpoints controller does when a pod is deleted
(before its preStop pause and SIGTERM). Server slots are declared up front (`slots`); a slot
whose replica is not running is simply down until its `/readyz` answers 200.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.servers import HOST, free_port

BACKEND = "replicas"
# Health checks every 200 ms: 2 failures take a replica out, 1 success brings it in (the
# chart's readiness probe runs every 5 s; here everything is faster, to keep runs short).
CHECK = "check inter 200ms fall 2 rise 1"


def haproxy_binary() -> str | None:
    """The haproxy on PATH (or Debian's /usr/sbin/haproxy), else None."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


@dataclass(frozen=True, slots=True)
class Slot:
    """One server line: its name in the backend and the replica port it points at."""

    name: str
    port: int


def config(port: int, slots: Sequence[Slot], balance: str, socket_path: Path) -> str:
    """The haproxy.cfg text: one frontend on `port`, one backend of `slots` balanced by
    `balance` (`leastconn`, `roundrobin`). No server `maxconn`: HAProxy queues nothing
    itself, every request reaches a replica, which sheds on its own (503)."""
    servers = "\n".join(f"    server {s.name} {HOST}:{s.port} {CHECK}" for s in slots)
    return f"""global
    stats socket {socket_path} mode 600 level admin
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout queue 5s
    option http-keep-alive
    retries 2
    option redispatch

frontend replicas_in
    bind {HOST}:{port}
    default_backend {BACKEND}

backend {BACKEND}
    balance {balance}
    option httpchk GET /readyz
    http-check expect status 200
{servers}
"""


class HAProxy:
    """A running haproxy: `url` to send requests to, `set_state`/`enable` through its socket."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, socket_path: Path) -> None:
        self.proc = proc
        self.url = url
        self._socket = socket_path

    def command(self, line: str) -> str:
        """One runtime API command; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self._socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def set_state(self, server: str, state: str) -> None:
        """`ready`, `drain` or `maint` for one server (`set server`)."""
        answer = self.command(f"set server {BACKEND}/{server} state {state}")
        if answer.strip():
            raise RuntimeError(f"haproxy: {answer.strip()}")

    def status(self) -> dict[str, str]:
        """Each server's check status (`UP`, `DOWN`, `MAINT`, ...) from `show stat`."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == BACKEND and row.get("svname") not in ("BACKEND", "FRONTEND"):
                out[row["svname"]] = row["status"]
        return out

    def wait_status(self, server: str, status: str, timeout_s: float = 30) -> None:
        until = time.monotonic() + timeout_s
        while not self.status().get(server, "").startswith(status):
            if time.monotonic() > until:
                raise TimeoutError(f"{server} not {status} within {timeout_s:g} s: {self.status()}")
            time.sleep(0.05)


@contextlib.contextmanager
def running(slots: Sequence[Slot], balance: str, workdir: Path) -> Iterator[HAProxy]:
    """haproxy in the foreground (`-db`) with `config(...)`, until the block ends."""
    binary = haproxy_binary()
    if binary is None:
        raise FileNotFoundError("haproxy is not installed (apt-get install -y haproxy)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    socket_path = workdir / "haproxy.sock"
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(config(port, slots, balance, socket_path), encoding="utf-8")
    check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy rejected its config:\n{check.stdout}{check.stderr}")
    log = (workdir / "haproxy.log").open("wb")
    proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=log, stderr=log)
    try:
        until = time.monotonic() + 10
        while not socket_path.exists():
            if proc.poll() is not None or time.monotonic() > until:
                raise RuntimeError(f"haproxy did not start (see {workdir / 'haproxy.log'})")
            time.sleep(0.05)
        yield HAProxy(proc, f"http://{HOST}:{port}", socket_path)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
