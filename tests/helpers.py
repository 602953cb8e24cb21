"""Test helpers shared by the suites: in-process clients, real servers, readiness polling.

(A module of its own: several folders have a conftest.py, so `import conftest` is ambiguous.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import REGISTRY
from starlette.testclient import TestClient
from structlog.testing import capture_logs

from loadtest.servers import free_port
from service.app import create_app
from service.settings import Settings

SEED_TEXT = "Paris is the [MASK] of France."


def post_concurrently(client: TestClient, bodies: list[dict[str, Any]]) -> list[Any]:
    """POST / each JSON body at once (a thread each, so they can meet in batches); every answer
    must be 200; their JSON in order."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: client.post("/", json=b), bodies))
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json() for r in responses]


def assert_close(a: Any, b: Any) -> None:
    """Equal structure; numbers within 1e-4; lists of `{label, score}` compared by label (tiny
    random models have near-ties, so their order may differ); other values equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_close(a[k], b[k])
    elif isinstance(a, list) and a and isinstance(a[0], dict) and "label" in a[0]:
        assert sorted(x["label"] for x in a) == sorted(x["label"] for x in b)
        by_label = {x["label"]: x["score"] for x in b}
        for x in a:
            assert x["score"] == pytest.approx(by_label[x["label"]], abs=1e-4)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_close(x, y)
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(float(b), abs=1e-4)
    else:
        assert a == b


def batch_sizes() -> tuple[float, float]:
    """From the batch size histogram: (batches of more than one input, inputs in them)."""
    count = REGISTRY.get_sample_value("pipeline_server_batch_size_count") or 0.0
    total = REGISTRY.get_sample_value("pipeline_server_batch_size_sum") or 0.0
    ones = REGISTRY.get_sample_value("pipeline_server_batch_size_bucket", {"le": "1.0"}) or 0.0
    return count - ones, total - ones


@contextmanager
def captured_logs(*modules: ModuleType) -> Iterator[list[Any]]:
    """structlog's `capture_logs`, also for the `log` of `modules` once the app's logging setup
    has run in this process: it caches each logger on first use
    (`cache_logger_on_first_use`), and a cached logger no longer sees `capture_logs`'
    processors. Each module's `log` is a fresh proxy for the duration."""
    with capture_logs() as logs, pytest.MonkeyPatch.context() as patch:
        for module in modules:
            patch.setattr(module, "log", structlog.get_logger(module.__name__))
        yield logs


def wait_ready(get: Callable[[str], Any], timeout: float = 60) -> None:
    """Poll GET /readyz until 200 (fails the test after `timeout` seconds)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            if get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"not ready after {timeout}s")


@contextmanager
def app_client(model: Path | None = None, **settings: Any) -> Iterator[TestClient]:
    """An in-process app (lifespan run, model loaded and warmed) and its TestClient."""
    app = create_app(Settings(model_id=str(model) if model else None, **settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client.get)
        yield client


class ServerProcess:
    """The real console script (`pipeline-server`: gunicorn + uvicorn worker) on 127.0.0.1."""

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file
        full_env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port), **env}
        self._log = log_file.open("wb")
        script = Path(sys.executable).with_name("pipeline-server")
        self.proc = subprocess.Popen(
            [str(script)], env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kw)

    def post(self, path: str = "/", **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kw.pop("timeout", 30), **kw)

    def wait_ready(self, timeout: float = 90) -> None:
        try:
            wait_ready(self.get, timeout)
        except AssertionError:
            raise AssertionError(f"server not ready; log:\n{self.log()}") from None

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_file.read_text(errors="replace")


SCHEMATHESIS_CONFIG = Path(__file__).parent / "protocols" / "schemathesis.toml"


def schemathesis_finds_nothing(url: str, cwd: Path, *headers: str, timeout_s: float = 300) -> None:
    """Run schemathesis against `url`'s /openapi.json: every operation, every check (no 5xx, no
    answer outside the document, valid data accepted and invalid refused), 20 examples per
    operation with a fixed seed (the same cases each run), one worker. `headers`: extra
    `Name: value` headers on every request. Fails the test with schemathesis's report."""
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file", str(SCHEMATHESIS_CONFIG),
        "run", f"{url}/openapi.json",
        "--checks", "all",
        "--max-examples", "20",
        "--seed", "1",
        "--workers", "1",
        "--generation-database", "none",
        "--request-timeout", "30",
        "--no-color",
    ]  # fmt: skip
    for header in headers:
        command += ["-H", header]
    run = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failure" not in run.stdout
