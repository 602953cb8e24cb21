"""In-process helpers for the overload, deadline and disconnect tests.

`Recorder` wraps `service.engine.loading.load.load_engine` so a test sees which texts reached the
pipeline (`Engine.run`) and can make batches slow or stuck. `serve()` runs the app under a real
uvicorn server in a thread on 127.0.0.1, so a client can really disconnect (TestClient cannot).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from helpers import free_port, wait_ready
from prometheus_client import REGISTRY
from starlette.applications import Starlette

from service.app import create_app
from service.engine.jobs import Unit
from service.engine.loading.load import load_engine
from service.engine.types import Engine
from service.http.edge import EdgeProtocol
from service.settings import Settings


class Recorder:
    """An engine factory that records the texts of every `Engine.run` call.

    `delay_per_input_s` sleeps in `run` per input of the batch (torch-free slowness, the same
    for warm-up, so the service-time estimate is right from the start, unless
    `delay_warm_up=False`: then only once `slow` is set). While `gate` is cleared, `run` blocks
    on it (a stuck batch); while `prepare_gate` is cleared, `prepare` blocks (a stuck thread
    outside any batch). When `crash` is set, `run` raises it (e.g. a BaseException that ends
    the inference thread)."""

    def __init__(
        self, delay_per_input_s: float = 0.0, *, delay_warm_up: bool = True, cold_s: float = 0.0
    ) -> None:
        self.delay_per_input_s = delay_per_input_s
        self.cold_s = cold_s  # extra seconds of the very first run (a cold start)
        self.slow = threading.Event()
        if delay_warm_up:
            self.slow.set()
        self.gate = threading.Event()
        self.gate.set()
        self.prepare_gate = threading.Event()
        self.prepare_gate.set()
        self.crash: BaseException | None = None
        self.ran: list[str] = []
        self.engine: Engine | None = None

    def __call__(self, settings: Settings) -> Engine:
        engine = load_engine(settings)
        prepare, prepare_many, run = engine.prepare, engine.prepare_many, engine.run
        texts: dict[int, tuple[Any, str]] = {}  # keeps each prepared object alive: ids stay unique

        def recording_prepare(unit: Unit) -> Any:
            self.prepare_gate.wait(60)
            prepared = prepare(unit)
            texts[id(prepared)] = (prepared, unit.text or "")
            return prepared

        def recording_prepare_many(units: Sequence[Unit]) -> list[Any]:
            self.prepare_gate.wait(60)
            results = prepare_many(units)
            for unit, result in zip(units, results, strict=True):
                if not isinstance(result, Exception):
                    texts[id(result)] = (result, unit.text or "")
            return results

        def recording_run(batch: list[Any]) -> list[Any]:
            self.ran.extend(texts[id(p)][1] if id(p) in texts else "?" for p in batch)
            self.gate.wait(60)
            if self.cold_s and len(self.ran) == len(batch):  # the first batch ever
                time.sleep(self.cold_s)
            if self.crash is not None:
                raise self.crash
            if self.slow.is_set():
                time.sleep(self.delay_per_input_s * len(batch))
            return run(batch)

        engine.prepare = recording_prepare  # type: ignore[method-assign]
        engine.prepare_many = recording_prepare_many  # type: ignore[method-assign]
        engine.run = recording_run  # type: ignore[method-assign]
        self.engine = engine
        return engine

    def wait_ran(self, text: str, timeout: float = 10) -> None:
        """Block until `text` has been passed to `Engine.run`."""
        until = time.monotonic() + timeout
        while text not in self.ran:
            if time.monotonic() > until:
                raise AssertionError(f"{text!r} never ran; ran: {self.ran}")
            time.sleep(0.005)


class Served:
    """A running in-process server: its base `url` and the app (for its runtime's state)."""

    def __init__(self, app: Starlette, url: str, server: uvicorn.Server) -> None:
        self.app = app
        self.url = url
        self._server = server

    def begin_drain(self) -> None:
        """What SIGTERM does first (the signal itself only reaches the main thread)."""
        loop = self._server.servers[0].get_loop()
        loop.call_soon_threadsafe(self.app.state.runtime.begin_drain)

    @property
    def depth(self) -> int:
        return int(self.app.state.runtime.inference.queue_depth)

    def wait_depth(self, depth: int, timeout: float = 10) -> None:
        until = time.monotonic() + timeout
        while self.depth != depth:
            if time.monotonic() > until:
                raise AssertionError(f"queue depth {self.depth}, expected {depth}")
            time.sleep(0.005)


@contextmanager
def serve(
    settings: Settings,
    engine_factory: Callable[[Settings], Engine] = load_engine,
    *,
    edge: bool = True,
) -> Iterator[Served]:
    """`create_app(settings, engine_factory)` under uvicorn with the service's HTTP edge (as in
    production; `edge=False`: uvicorn's own httptools protocol, as another ASGI server would
    serve the app) in a thread; yields once /readyz answers 200, stops the server (lifespan
    shutdown) after."""
    app = create_app(settings, engine_factory=engine_factory)
    port = free_port()
    http = EdgeProtocol.bound(app.admission) if edge else "httptools"
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, lifespan="on", http=http
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda path: httpx.get(url + path, timeout=5), timeout=60)
        yield Served(app, url, server)
    finally:
        server.should_exit = True
        thread.join(30)


def sample(name: str, **labels: str) -> float:
    """The current value of one sample of the default Prometheus registry (0 if absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def raw_request(url: str, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection to `url`, send `data` (a whole HTTP request), and return the
    (reader, writer) pair without waiting for the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    return reader, writer


def http_post(body: str | bytes, content_type: str = "text/plain", **headers: str) -> bytes:
    """A whole `POST /` request with `body` (Content-Length set) and extra `headers`."""
    data = body.encode() if isinstance(body, str) else body
    lines = [
        "POST / HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + data


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length: status, lower-cased headers, body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    pairs = (line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in pairs}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body
