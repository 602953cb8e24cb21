"""The rendered Deployment, run the way a kubelet would run it, with no cluster.

From `helm template` (default values) the test takes the container's command, args, env,
probes, preStop hook and grace period, and starts the installed `pipeline-server` with them on
127.0.0.1. Only HOST/PORT (a free loopback port) and container-only paths (the baked model
folder, the emptyDir mounts, TMPDIR for /tmp) are replaced; PATH and the test-only
MODEL_LOAD_DELAY_S are added. Then, like a kubelet:

1. the startup probe polls /readyz until it passes (a failureThreshold-th failure would be a
   restart); readiness and liveness start only after it;
2. clients send load while readiness and liveness keep probing on their periods;
3. on deletion, the preStop command runs (traffic still arrives during it, as endpoints
   converge), then SIGTERM, with requests in flight; the grace period bounds the whole.

Probe periods are divided by `PERIOD_SCALE` to keep the test short; thresholds and timeouts
are the rendered ones (a probe still has the full rendered time to answer).
MODEL_LOAD_DELAY_S makes the load slow enough that "not ready while loading" is observed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from loadtest.servers import free_port
from service.engine.loading.load import default_model_dir

from .helm import Manifest, container_env, only, render, server_container

pytestmark = pytest.mark.kubelet

PERIOD_SCALE = 5  # rendered probe periods / PERIOD_SCALE; e.g. startup 5 s -> 1 s
LOAD_DELAY_S = 4.0
LOAD_S = 6.0
CLIENTS = 12
SEED = "Paris is the [MASK] of France."
IMAGE_CMD = ["pipeline-server"]  # the Dockerfile's CMD, used when the chart sets no command


@dataclass(frozen=True)
class Probe:
    path: str
    period_s: float
    timeout_s: float
    failure_threshold: int
    success_threshold: int
    initial_delay_s: float

    @classmethod
    def from_manifest(cls, probe: Manifest) -> Probe:
        return cls(
            path=probe["httpGet"]["path"],
            period_s=probe.get("periodSeconds", 10) / PERIOD_SCALE,
            timeout_s=probe.get("timeoutSeconds", 1),
            failure_threshold=probe.get("failureThreshold", 3),
            success_threshold=probe.get("successThreshold", 1),
            initial_delay_s=probe.get("initialDelaySeconds", 0) / PERIOD_SCALE,
        )


@dataclass
class Record:
    """What the kubelet and the clients saw, with times since the container started."""

    started_at: float = 0.0
    startup_failures: int = 0
    liveness_failures_in_a_row: int = 0
    liveness_max_failures_in_a_row: int = 0
    readiness: list[tuple[float, bool]] = field(default_factory=list)
    # (sent at, status or the exception's name, answered at)
    requests: list[tuple[float, int | str, float]] = field(default_factory=list)


def resolve_env(container: Manifest, port: int, tmp: Path) -> dict[str, str]:
    """The container's env, mapped onto this machine: only container-only parts change."""
    env = container_env(container)
    assert env["MODEL_ID"] == "/models/model", "the model baked into the image"
    env |= {"HOST": "127.0.0.1", "PORT": str(port), "MODEL_ID": str(default_model_dir())}
    for name in ("HF_HOME", "XDG_CACHE_HOME"):  # the /cache emptyDir
        env[name] = str(tmp / env[name].lstrip("/"))
    return env


class Kubelet:
    def __init__(self, base: str, session: aiohttp.ClientSession, record: Record) -> None:
        self.base = base
        self.session = session
        self.record = record
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def check(self, probe: Probe) -> bool:
        """An httpGet probe: success is a 2xx/3xx within the timeout; anything else fails."""
        try:
            timeout = aiohttp.ClientTimeout(total=probe.timeout_s)
            async with self.session.get(self.base + probe.path, timeout=timeout) as r:
                return 200 <= r.status < 400
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def startup(self, probe: Probe) -> None:
        await asyncio.sleep(probe.initial_delay_s)
        while not await self.check(probe):
            self.record.startup_failures += 1
            assert self.record.startup_failures < probe.failure_threshold, (
                "startup probe exhausted: the kubelet would restart the container"
            )
            await asyncio.sleep(probe.period_s)
        self.record.started_at = self.now()

    async def readiness(self, probe: Probe) -> None:
        while True:
            self.record.readiness.append((self.now(), await self.check(probe)))
            await asyncio.sleep(probe.period_s)

    async def liveness(self, probe: Probe) -> None:
        while True:
            if await self.check(probe):
                self.record.liveness_failures_in_a_row = 0
            else:
                self.record.liveness_failures_in_a_row += 1
                self.record.liveness_max_failures_in_a_row = max(
                    self.record.liveness_max_failures_in_a_row,
                    self.record.liveness_failures_in_a_row,
                )
            await asyncio.sleep(probe.period_s)

    async def send(self, data: str | None = None, json: object = None) -> None:
        sent = self.now()
        try:
            async with self.session.post(self.base + "/", data=data, json=json) as r:
                await r.read()
                status: int | str = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            status = type(e).__name__
        self.record.requests.append((sent, status, self.now()))

    async def until_queued(self, limit_s: float = 5.0) -> None:
        """Return once inputs wait in the queue (so SIGTERM finds work), or after `limit_s`."""
        until = time.monotonic() + limit_s
        while time.monotonic() < until:
            async with self.session.get(self.base + "/metrics") as r:
                text = await r.text()
            if re.search(r"^pipeline_server_queue_depth [1-9]", text, re.MULTILINE):
                return
            await asyncio.sleep(0.02)

    async def clients(self, until: asyncio.Event) -> None:
        async def client(i: int) -> None:
            while not until.is_set():
                if i % 3 == 0:
                    await self.send(json={"inputs": [SEED, "A longer sentence to batch."] * 4})
                else:
                    await self.send(data=SEED)

        await asyncio.gather(*(client(i) for i in range(CLIENTS)))


def worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


async def play(
    kubelet: Kubelet, proc: subprocess.Popen[bytes], deployment: Manifest
) -> tuple[float, float, int]:
    """Run the pod's life; return (time preStop began, time of exit, exit code)."""
    container = server_container([deployment])
    startup, readiness, liveness = (
        Probe.from_manifest(container[k])
        for k in ("startupProbe", "readinessProbe", "livenessProbe")
    )
    await kubelet.startup(startup)
    probes = [
        asyncio.create_task(kubelet.readiness(readiness)),
        asyncio.create_task(kubelet.liveness(liveness)),
    ]
    workers = worker_pids(proc.pid)
    stop_load = asyncio.Event()
    load = asyncio.create_task(kubelet.clients(stop_load))
    await asyncio.sleep(LOAD_S)

    # Deletion: preStop runs while endpoints converge, so traffic keeps coming for a while.
    pre_stop_at = kubelet.now()
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    hook = await asyncio.create_subprocess_exec(*command)
    await asyncio.sleep(1.0)
    stop_load.set()
    await load
    assert worker_pids(proc.pid) == workers, "the worker restarted during load"
    await hook.wait()
    # Requests still in flight when SIGTERM lands: all were accepted, all must be answered.
    burst = [asyncio.create_task(kubelet.send(json={"inputs": [SEED] * 16})) for _ in range(6)]
    await kubelet.until_queued()
    for task in probes:
        task.cancel()
    proc.send_signal(signal.SIGTERM)
    sigterm_at = kubelet.now()
    await asyncio.sleep(0.3)
    late_ready = await kubelet.check(readiness)
    late = [kubelet.send(data=SEED) for _ in range(3)]
    await asyncio.gather(*burst, *late)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    code = await asyncio.wait_for(asyncio.to_thread(proc.wait), grace)
    assert not late_ready, "readiness must fail at once after SIGTERM"
    kubelet.record.requests.append((sigterm_at, "SIGTERM", sigterm_at))
    return pre_stop_at, kubelet.now(), code


async def run_pod(
    base: str, proc: subprocess.Popen[bytes], deployment: Manifest
) -> tuple[Record, float, float, int]:
    record = Record()
    connector = aiohttp.TCPConnector(limit=CLIENTS + 16)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        kubelet = Kubelet(base, session, record)
        pre_stop_at, exited_at, code = await play(kubelet, proc, deployment)
    return record, pre_stop_at, exited_at, code


def with_timeout(
    coro: Awaitable[tuple[Record, float, float, int]],
) -> tuple[Record, float, float, int]:
    async def bounded() -> tuple[Record, float, float, int]:
        return await asyncio.wait_for(coro, 240)

    return asyncio.run(bounded())


def test_rendered_pod_lifecycle(tmp_path: Path) -> None:
    docs = render(None)
    deployment = only(docs, "Deployment")
    container = server_container(docs)
    port = free_port()
    env = resolve_env(container, port, tmp_path)
    env |= {"MODEL_LOAD_DELAY_S": str(LOAD_DELAY_S), "PATH": os.environ["PATH"]}
    env["TMPDIR"] = str(tmp_path / "tmp")  # the /tmp emptyDir
    for folder in ("tmp", env["HF_HOME"], env["XDG_CACHE_HOME"]):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    command = container.get("command") or IMAGE_CMD
    command = [str(Path(sys.executable).with_name(command[0])), *command[1:]]
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*command, *container.get("args", [])], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            record, pre_stop_at, exited_at, code = with_timeout(
                run_pod(f"http://127.0.0.1:{port}", proc, deployment)
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log_text = log_path.read_text(errors="replace")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    # Ready only after the load, and the load fit the startup budget without a restart.
    assert record.startup_failures >= 1, "the startup probe never saw the model loading"
    assert record.started_at >= LOAD_DELAY_S
    first_ready = next(t for t, ok in record.readiness if ok)
    assert first_ready >= record.started_at
    # Never restarted by liveness, never out of the endpoints, while under load.
    liveness = Probe.from_manifest(container["livenessProbe"])
    assert record.liveness_max_failures_in_a_row < liveness.failure_threshold
    assert all(ok for _, ok in record.readiness), "readiness failed under load"
    # Zero accepted requests lost: everything sent before SIGTERM answered 200.
    sigterm_at = next(sent for sent, status, _ in record.requests if status == "SIGTERM")
    before = [status for sent, status, _ in record.requests if sent < sigterm_at]
    after = [status for sent, status, _ in record.requests if sent > sigterm_at]
    assert len(before) > 20, "too little load to mean anything"
    assert set(before) == {200}, f"lost or failed before SIGTERM: {set(before)}\n{log_text}"
    drained = [1 for sent, _, answered in record.requests if sent < sigterm_at < answered]
    assert drained, "no request was in flight at SIGTERM: the drain went untested"
    # After SIGTERM: refused or 503, never a reset mid-answer or another error.
    assert set(after) <= {503, "ClientConnectorError"}, after
    # Exit 0 within the grace period, counted from the start of preStop like the kubelet.
    assert code == 0, log_text
    assert exited_at - pre_stop_at < grace
    print(
        f"\nstartup: ready at {record.started_at:.1f}s after start "
        f"({record.startup_failures} failed startup checks); "
        f"{len(before)} requests before SIGTERM, all 200, {len(drained)} answered after it; "
        f"after SIGTERM: {after}; "
        f"exit {code} {exited_at - pre_stop_at:.1f}s after preStop began (grace {grace}s)"
    )
