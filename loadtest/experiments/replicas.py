"""Three replicas behind HAProxy on one machine: a rolling update, a slow replica, a retry storm.

``python -m loadtest.experiments.replicas`` (``make replicas``; about 5 minutes here; needs Debian's
``haproxy``). Every replica is the real server (``pipeline-server``, one gunicorn worker,
``TORCH_NUM_THREADS=1``) with the embedded all-MiniLM-L6-v2 model on a free 127.0.0.1 port;
HAProxy health-checks ``/readyz`` (``loadtest.experiments.haproxy``). The client is aiohttp, sending
``POST /v1/embeddings`` (one short sentence each), bounded in count and time.

Scenarios, in order (rates are shares of the measured ``capacity``):

- ``capacity``: 96 polite closed-loop clients (a 503 waits its Retry-After) for ``--seconds``,
  fewer than the replicas' queues hold (3 x 64): the three replicas' summed capacity, answers
  per second (they share this machine's cores).
- ``healthy``: an open-loop steady rate (``--load`` x capacity) for ``--seconds``, leastconn.
- ``rolling``: the same rate while each replica is replaced in turn as the chart's rolling
  update does it (maxSurge 1, maxUnavailable 0): start the new one, wait until HAProxy sees
  it ready, take the old one out of rotation (what the endpoints controller does when a pod
  is deleted), pause ``--prestop`` seconds (the preStop sleep), SIGTERM it, wait for its exit.
  Target: no failed request, no connection error, every request answered.
- ``slow leastconn`` / ``slow roundrobin``: the same rate with one replica held to
  ``--slow-cpu`` of a core (a cgroup CPU quota; MODEL_NICE=19 where cgroups cannot be
  written). Target, leastconn: p95 within ``P95_FACTOR`` x healthy's and shed rate at most
  healthy's + ``SHED_MARGIN``; round-robin is reported beside it.
- ``storm``: 480 clients (2.5 x what the replicas' queues hold) that resend the moment they
  are answered, 503 or not (no Retry-After honoured), for ``--seconds``. Target: goodput
  (200s/s) >= 0.8 x capacity.

Each scenario prints requests sent, answered (200), failed (anything but 200 and 503,
connection errors included, with their statuses), shed (503), and p50/p95 of the answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from loadtest.experiments import haproxy
from loadtest.servers import HOST, free_port, pipeline_server_command, stop, wait_ready

P95_FACTOR = 3.0  # slow replica, leastconn: p95 at most this times the healthy run's
SHED_MARGIN = 0.02  # ... and shed rate at most the healthy run's + this
GOODPUT_TARGET = 0.8
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
REPLICA_ENV = {
    "TORCH_NUM_THREADS": "1",  # three replicas share the cores: one thread each
    "REQUEST_TIMEOUT_S": "5",
    "MAX_QUEUE_SIZE": "64",
    "DRAIN_TIMEOUT_S": "10",
    "LOG_LEVEL": "warning",
}


# --- replicas ---------------------------------------------------------------------------------


@dataclass
class Replica:
    """One pipeline-server process on `port` (its own session, so SIGTERM reaches gunicorn)."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path  # its stdout and stderr

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def start_replica(port: int, logs: Path, extra: dict[str, str] | None = None) -> Replica:
    """Start one replica (not waiting for it); its output goes to `logs/replica-<port>.log`."""
    env = {
        **os.environ,
        **REPLICA_ENV,
        **(extra or {}),
        "HOST": HOST,
        "PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    log = logs / f"replica-{port}.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            pipeline_server_command(), env=env, stdout=sink, stderr=sink, start_new_session=True
        )
    return Replica(port, proc, log)


def slow_down(replica: Replica, cpu: float, name: str) -> str:
    """Hold `replica` (gunicorn and its worker) to `cpu` of one core with a cgroup CPU quota
    (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); returns how it was done."""
    period = 100_000
    quota = max(1000, int(cpu * period))
    v2, v1 = Path("/sys/fs/cgroup") / name, Path("/sys/fs/cgroup/cpu") / name
    with contextlib.suppress(OSError):
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            v2.mkdir(exist_ok=True)
            (v2 / "cpu.max").write_text(f"{quota} {period}")
            procs = v2 / "cgroup.procs"
        else:
            v1.mkdir(exist_ok=True)
            (v1 / "cpu.cfs_period_us").write_text(str(period))
            (v1 / "cpu.cfs_quota_us").write_text(str(quota))
            procs = v1 / "cgroup.procs"
        for pid in _process_tree(replica.proc.pid):
            procs.write_text(str(pid))
        return f"cgroup CPU quota {cpu:g} core"
    raise PermissionError("cannot write a cgroup here (run as root)")


def remove_cgroup(name: str) -> None:
    for path in (Path("/sys/fs/cgroup") / name, Path("/sys/fs/cgroup/cpu") / name):
        with contextlib.suppress(OSError):
            path.rmdir()


def _process_tree(pid: int) -> list[int]:
    import psutil

    parent = psutil.Process(pid)
    return [parent.pid, *(p.pid for p in parent.children(recursive=True))]


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one scenario's client saw."""

    name: str
    statuses: list[int] = field(default_factory=list)  # 0: connection error
    latencies: list[float] = field(default_factory=list)  # seconds, answered (200) only
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.statuses)

    @property
    def answered(self) -> int:
        return self.statuses.count(200)

    @property
    def shed(self) -> int:
        return self.statuses.count(503)

    @property
    def failed(self) -> int:
        return self.sent - self.answered - self.shed

    @property
    def connection_errors(self) -> int:
        return self.statuses.count(0)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def row(self) -> str:
        rate = self.answered / self.seconds if self.seconds else 0.0
        return (
            f"{self.name:<18} sent {self.sent:>6}  answered {self.answered:>6}  "
            f"failed {self.failed:>4}  shed {self.shed:>5}  "
            f"p50 {1000 * self.percentile(0.5):7.1f} ms  p95 {1000 * self.percentile(0.95):7.1f} ms"
            f"  ({rate:.1f} answers/s over {self.seconds:.1f} s)"
            + (f"  failed: {self.failures()}" if self.failed else "")
        )

    def failures(self) -> str:
        """The failed requests by status (0: connection error), e.g. `504 x 12`."""
        counts = Counter(s for s in self.statuses if s not in (200, 503))
        return ", ".join(f"{status} x {n}" for status, n in sorted(counts.items()))


@dataclass(frozen=True)
class Ask:
    """What every request of a run sends: `path` and a JSON `body`."""

    path: str = "/v1/embeddings"
    body: dict[str, object] = field(default_factory=lambda: {"input": SENTENCE, "model": "m"})


EMBED = Ask()


async def _one(session: aiohttp.ClientSession, url: str, tally: Tally, body: object) -> int:
    started = time.monotonic()
    try:
        async with session.post(url, json=body) as response:
            await response.read()
            status = response.status
            retry = float(response.headers.get("Retry-After", "1") or 1)
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.errors.append(f"{type(exc).__name__}: {exc}")
        status, retry = 0, 1.0
    tally.statuses.append(status)
    if status == 200:
        tally.latencies.append(time.monotonic() - started)
    return status if status != 503 else -int(retry * 1000)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30)
    )


async def steady(
    base: str, name: str, rate: float, until: Callable[[], bool], ask: Ask = EMBED
) -> Tally:
    """Open loop: one request every 1/`rate` s until `until()` is true; then wait for all."""
    tally, url, tasks = Tally(name), base + ask.path, []
    started = time.monotonic()
    async with _session() as session:
        n = 0
        while not until():
            tasks.append(asyncio.create_task(_one(session, url, tally, ask.body)))
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    tally.seconds = time.monotonic() - started
    return tally


async def closed_loop(base: str, name: str, clients: int, seconds: float, polite: bool) -> Tally:
    """`clients` loops, each sending its next request when its answer arrives; `polite`
    loops wait a 503's Retry-After first, the others resend at once (a retry storm)."""
    tally, url = Tally(name), base + EMBED.path
    ends = time.monotonic() + seconds

    async def loop(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < ends:
            code = await _one(session, url, tally, EMBED.body)
            if code < 0 and polite:
                await asyncio.sleep(min(-code / 1000, max(0.0, ends - time.monotonic())))

    started = time.monotonic()
    async with _session() as session:
        await asyncio.gather(*(loop(session) for _ in range(clients)))
    tally.seconds = time.monotonic() - started
    return tally


def for_seconds(seconds: float) -> Callable[[], bool]:
    ends = time.monotonic() + seconds
    return lambda: time.monotonic() >= ends


# --- the rolling update ----------------------------------------------------------------------


def roll(
    proxy: haproxy.HAProxy,
    replicas: list[Replica],
    slots: Sequence[haproxy.Slot],
    logs: Path,
    prestop_s: float,
    log: Callable[[str], None] = print,
    extra: dict[str, str] | None = None,
) -> list[int]:
    """Replace each replica in turn (the chart's RollingUpdate, maxSurge 1): returns the old
    ones' exit codes. `slots` holds 2 x len(replicas): the old ones first."""
    codes = []
    n = len(replicas)
    for i in range(n):
        old_slot, new_slot = slots[i], slots[n + i]
        new = start_replica(new_slot.port, logs, extra)
        wait_ready(new.url + "/readyz", 180, new.proc, new.log)
        proxy.wait_status(new_slot.name, "UP")  # the endpoints now list it
        proxy.set_state(old_slot.name, "maint")  # the old pod is deleted: out of the endpoints
        time.sleep(prestop_s)  # preStop: requests already sent to it finish meanwhile
        codes.append(stop(replicas[i].proc, grace_s=30))  # SIGTERM, drain, exit
        log(f"  replaced replica {i}: new ready, old exited {codes[-1]}")
        replicas[i] = new
    return codes


# --- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def replica_set(
    ports: Sequence[int], logs: Path, extra: dict[str, str] | None = None
) -> Iterator[list[Replica]]:
    """Replicas on `ports`, started together, ready when the block starts, stopped after."""
    replicas = [start_replica(p, logs, extra) for p in ports]
    try:
        for r in replicas:
            wait_ready(r.url + "/readyz", 240, r.proc, r.log)
        yield replicas
    finally:
        for r in replicas:
            stop(r.proc, grace_s=30)


async def _run(args: argparse.Namespace, workdir: Path) -> list[str]:
    """Every scenario; returns the failed targets (empty: all met)."""
    say = print
    misses: list[str] = []
    old = [haproxy.Slot(f"r{i}", free_port()) for i in range(3)]
    new = [haproxy.Slot(f"n{i}", free_port()) for i in range(3)]
    slots = [*old, *new]
    with (
        replica_set([s.port for s in old], workdir) as replicas,
        haproxy.running(slots, "leastconn", workdir / "leastconn") as least,
        haproxy.running(slots, "roundrobin", workdir / "roundrobin") as robin,
    ):
        for proxy in (least, robin):
            for s in old:
                proxy.wait_status(s.name, "UP")
            for s in new:
                proxy.wait_status(s.name, "DOWN")
        say(f"three replicas ready; haproxy {least.url} (leastconn), {robin.url} (roundrobin)")
        capacity = await closed_loop(least.url, "capacity", 96, args.seconds, polite=True)
        say(capacity.row())
        cap = capacity.answered / capacity.seconds
        rate = args.load * cap
        say(f"steady rate: {rate:.1f} requests/s ({args.load:g} x capacity)")

        healthy = await steady(least.url, "healthy", rate, for_seconds(args.seconds))
        say(healthy.row())

        storm = await closed_loop(least.url, "storm", 480, args.seconds, polite=False)
        say(storm.row())
        goodput = storm.answered / storm.seconds
        say(f"  storm goodput {goodput:.1f}/s = {goodput / cap:.2f} x capacity")
        if goodput < GOODPUT_TARGET * cap:
            misses.append(f"storm goodput {goodput / cap:.2f} x capacity < {GOODPUT_TARGET}")

        # Slow: one replica held to a share of a core (replica 0 of the current set).
        try:
            how = slow_down(replicas[0], args.slow_cpu, "pipeline-server-slow-replica")
        except PermissionError:
            how = ""
        say(f"replica 0 slowed: {how or 'not possible here (no cgroup)'}")
        if how:
            slow_lc = await steady(least.url, "slow leastconn", rate, for_seconds(args.seconds))
            say(slow_lc.row())
            slow_rr = await steady(robin.url, "slow roundrobin", rate, for_seconds(args.seconds))
            say(slow_rr.row())
            p95_ratio = slow_lc.percentile(0.95) / healthy.percentile(0.95)
            shed_lc, shed_h = slow_lc.shed / slow_lc.sent, healthy.shed / healthy.sent
            say(
                f"  leastconn: p95 {p95_ratio:.2f} x healthy, shed {shed_lc:.3f} "
                f"(healthy {shed_h:.3f}); roundrobin: p95 "
                f"{slow_rr.percentile(0.95) / healthy.percentile(0.95):.2f} x healthy, "
                f"shed {slow_rr.shed / slow_rr.sent:.3f}, failed {slow_rr.failed}"
            )
            if p95_ratio > P95_FACTOR or shed_lc > shed_h + SHED_MARGIN or slow_lc.failed:
                misses.append("slow replica under leastconn outside its bounds")

        # Rolling: replaces every replica (the slowed one too: the new set is healthy).
        done = False
        load = asyncio.create_task(steady(least.url, "rolling", rate, lambda: done))
        codes = await asyncio.to_thread(roll, least, replicas, slots, workdir, args.prestop, say)
        await asyncio.sleep(1.0)
        done = True
        rolling = await load
        say(rolling.row())
        if rolling.failed or rolling.connection_errors or rolling.answered != rolling.sent:
            misses.append(
                f"rolling update: {rolling.failed} failed, {rolling.shed} shed, "
                f"errors {rolling.errors[:3]}"
            )
        if any(codes):
            misses.append(f"old replicas exited {codes}")
    remove_cgroup("pipeline-server-slow-replica")
    return misses


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="length of each scenario")
    p.add_argument("--load", type=float, default=0.5, help="steady rate, a share of capacity")
    p.add_argument("--prestop", type=float, default=2.0, help="preStop pause (s)")
    p.add_argument("--slow-cpu", type=float, default=0.1, help="the slow replica's CPU (cores)")
    args = p.parse_args(argv)
    if haproxy.haproxy_binary() is None:
        print("haproxy is not installed (apt-get install -y haproxy)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="replicas-") as tmp:
        misses = asyncio.run(_run(args, Path(tmp)))
    for miss in misses:
        print(f"TARGET MISSED: {miss}")
    print("all targets met" if not misses else f"{len(misses)} target(s) missed")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
