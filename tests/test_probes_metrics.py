"""Probes, body limits and the API key: /livez on a stuck or dead inference thread,
probes answered from state while inference is stuck, C06 (body limits), C16/C17 (a model load
slower than the liveness budget and than gunicorn's worker timeout) on the real server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ServerProcess, app_client
from inprocess import Recorder, Served, serve

from service.settings import Settings

C16_TEST = "test_c16_c17_slow_load_is_not_restarted_and_probes_tell_the_truth"
LOAD_DELAY_S = 35  # longer than gunicorn's 30 s worker timeout (C17)


# -- a stuck or dead inference thread (in-process) ---------------------------------------------
@pytest.fixture
def stuck(tiny_models: dict[str, Path]) -> Iterator[tuple[Served, Recorder]]:
    recorder = Recorder()
    settings = Settings(
        model_id=str(tiny_models["text-classification"]),
        max_batch_size=1,
        torch_num_threads=1,
        liveness_stall_s=1.0,  # above the idle thread's 0.5 s wake-up
        request_timeout_s=5,
    )
    with serve(settings, recorder) as served:
        try:
            yield served, recorder
        finally:  # never leave the thread blocked: the server stops after it
            recorder.gate.set()
            recorder.prepare_gate.set()


def _get(served: Served, path: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.get(served.url + path, timeout=5)
    return response, time.monotonic() - started


def _wait_livez(served: Served, status: int, timeout: float = 10) -> httpx.Response:
    until = time.monotonic() + timeout
    while True:
        response, _ = _get(served, "/livez")
        if response.status_code == status or time.monotonic() > until:
            return response
        time.sleep(0.05)


def test_livez_503_while_a_batch_runs_past_the_stall_limit(
    stuck: tuple[Served, Recorder],
) -> None:
    served, recorder = stuck
    recorder.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(httpx.post, served.url + "/", content="stuck", timeout=30)
        recorder.wait_ran("stuck")
        for path in ("/livez", "/readyz"):  # answered from state, not behind the stuck batch
            response, seconds = _get(served, path)
            assert response.status_code == 200 and seconds < 0.5, (path, seconds)
        response = _wait_livez(served, 503)
        assert response.status_code == 503
        assert response.json() == {"status": "a batch has run longer than 1s"}
        recorder.gate.set()
        assert request.result().status_code == 200
    assert _wait_livez(served, 200).status_code == 200


def test_livez_503_when_the_thread_is_stuck_outside_a_batch(
    stuck: tuple[Served, Recorder],
) -> None:
    """The heartbeat: a thread stuck anywhere (here in tokenization) is not live either."""
    served, recorder = stuck
    recorder.prepare_gate.clear()
    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(httpx.post, served.url + "/", content="stuck early", timeout=30)
        response = _wait_livez(served, 503, timeout=5)
        assert response.status_code == 503, response.json()
        assert "heartbeat" in response.json()["status"]
        recorder.prepare_gate.set()
        assert request.result().status_code == 200
    assert _wait_livez(served, 200).status_code == 200


class _Crash(BaseException):
    """Not an Exception: gets past the batch's error isolation and ends the thread."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_livez_503_when_the_inference_thread_died(stuck: tuple[Served, Recorder]) -> None:
    served, recorder = stuck
    recorder.crash = _Crash()
    response = httpx.post(served.url + "/", content="crash", timeout=30)
    assert response.status_code >= 500
    livez = _wait_livez(served, 503)
    assert livez.status_code == 503
    readyz, _ = _get(served, "/readyz")
    assert readyz.status_code == 503
    after = httpx.post(served.url + "/", content="after", timeout=10)
    assert after.status_code == 503 and int(after.headers["retry-after"]) >= 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_batch_that_killed_the_thread_is_answered_at_once(
    stuck: tuple[Served, Recorder],
) -> None:
    served, recorder = stuck
    recorder.crash = _Crash()
    started = time.monotonic()
    response = httpx.post(
        served.url + "/", content="crash", headers={"X-Request-Timeout": "5"}, timeout=30
    )
    assert response.status_code in (500, 503), response.status_code
    assert time.monotonic() - started < 2


# -- the API key (in-process) -----------------------------------------------------------------
def test_api_key_guards_everything_but_probes_and_metrics(tiny_models: dict[str, Path]) -> None:
    model = tiny_models["text-classification"]
    with app_client(model, api_key="s3cret", torch_num_threads=1) as client:
        good = {"Authorization": "Bearer s3cret"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            r = client.post("/", content="hello", headers=headers)
            assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
            assert "s3cret" not in r.text
            assert client.get("/info", headers=headers).status_code == 401
        assert client.post("/", content="hello", headers=good).status_code == 200
        assert client.get("/info", headers=good).status_code == 200
        for path in ("/readyz", "/livez", "/metrics"):
            assert client.get(path).status_code == 200, path


# -- the real server ---------------------------------------------------------------------------
def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), json.loads(body)


@pytest.mark.server
def test_c06_body_limits(
    start_server: Callable[..., ServerProcess], tiny_models: dict[str, Path]
) -> None:
    """413 before the body is held: a declared 50 MB body is refused after 64 KiB was sent; a
    chunked body (no Content-Length) is refused once it passes the limit while more is still
    coming. The control request is served while both uploads hang open. Too many inputs: 413
    naming MAX_CLIENT_BATCH_SIZE."""
    server = start_server(
        MODEL_ID=str(tiny_models["text-classification"]),
        TORCH_NUM_THREADS="1",
        MAX_BODY_BYTES=str(1 << 20),
    )
    server.wait_ready()
    declared = _raw(server.url)
    declared.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 50000000\r\n\r\n" + b"a" * 65536
    )
    status, body = _read_answer(declared)
    assert status == 413 and "MAX_BODY_BYTES" in body["error"], body

    chunked = _raw(server.url)
    chunked.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (65536, b"b" * 65536)
    for _ in range(17):  # 17 x 64 KiB: just over the 1 MiB limit, and no last chunk
        chunked.sendall(chunk)
    status, body = _read_answer(chunked)
    assert status == 413 and "MAX_BODY_BYTES" in body["error"], body

    control = server.post(content="A fixed control sentence.")
    assert control.status_code == 200, control.text
    declared.close()
    chunked.close()

    many = server.post(json={"inputs": ["short"] * 10_000})
    assert many.status_code == 413
    assert "at most 2048" in many.json()["error"]  # the default
    assert "MAX_CLIENT_BATCH_SIZE" in many.json()["error"]
    assert server.post(content="A fixed control sentence.").status_code == 200
    assert server.get("/readyz").status_code == 200
    metrics = server.get("/metrics").text
    assert "pipeline_server_queue_depth 0.0" in metrics


# -- C16/C17: started first, checked last, so the 35 s load overlaps the tests above ----------
class _Timeline:
    """Polls /livez, /readyz and inference every 0.25 s from the start until 1 s after ready.

    `seen` holds (wall-clock seconds, what, status, Retry-After); "connect" with status 0
    when the connection failed (only before gunicorn listens)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.seen: list[tuple[float, str, int, str | None]] = []
        self.ready_at: float | None = None  # wall clock, first /readyz 200
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        until = time.monotonic() + LOAD_DELAY_S + 90
        while time.monotonic() < until:
            if self.ready_at is not None and time.time() > self.ready_at + 1:
                return
            self._probe()
            time.sleep(0.25)

    def _probe(self) -> None:
        calls: list[tuple[str, Callable[[], httpx.Response]]] = [
            ("livez", lambda: self.server.get("/livez")),
            ("readyz", lambda: self.server.get("/readyz")),
            ("infer", lambda: self.server.post(content="hello", timeout=10)),
        ]
        for what, call in calls:
            now = time.time()
            try:
                response = call()
            except httpx.TransportError:
                self.seen.append((now, "connect", 0, None))
                return
            retry_after = response.headers.get("retry-after")
            self.seen.append((now, what, response.status_code, retry_after))
            if what == "readyz" and response.status_code == 200 and self.ready_at is None:
                self.ready_at = now

    def join(self) -> None:
        self._thread.join(LOAD_DELAY_S + 120)


@pytest.fixture(scope="module", autouse=True)
def slow_load(
    request: pytest.FixtureRequest,
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_Timeline | None]:
    """Start the slow-loading server before this module's first test, if C16/C17 is selected."""
    if not any(item.name == C16_TEST for item in request.session.items):
        yield None
        return
    log = tmp_path_factory.mktemp("slow-load") / "server.log"
    server = ServerProcess(
        {
            "MODEL_ID": str(tiny_models["text-classification"]),
            "MODEL_LOAD_DELAY_S": str(LOAD_DELAY_S),
            "TORCH_NUM_THREADS": "1",
        },
        log,
    )
    timeline = _Timeline(server)
    yield timeline
    server.terminate()


@pytest.mark.server
def test_c16_c17_slow_load_is_not_restarted_and_probes_tell_the_truth(
    slow_load: _Timeline | None,
) -> None:
    """A load of 35 s (over gunicorn's 30 s worker timeout and any sane liveness budget): the
    worker is not killed (no WORKER TIMEOUT, one boot); meanwhile /livez 200, /readyz 503 and
    inference 503 with Retry-After; /readyz turns 200 within one poll of the model being ready,
    and inference answers."""
    assert slow_load is not None
    slow_load.join()
    server, seen, ready_at = slow_load.server, slow_load.seen, slow_load.ready_at
    log = server.log()
    assert ready_at is not None, log
    assert "WORKER TIMEOUT" not in log
    assert log.count("Booting worker") == 1
    assert server.proc.poll() is None  # the same process, still serving
    model_ready = next(json.loads(x) for x in log.splitlines() if '"model_ready"' in x)
    assert model_ready["load_s"] >= LOAD_DELAY_S
    ready_logged = datetime.fromisoformat(model_ready["timestamp"]).timestamp()
    # ready_at is when that poll was sent: it may leave a few ms before the log line is stamped.
    assert -0.5 <= ready_at - ready_logged < 1.5  # /readyz 200 at the first poll after the load

    loading = [x for x in seen if x[0] < ready_logged]
    assert loading[-1][0] > ready_logged - 2  # polled through the whole load
    first_live = next(i for i, x in enumerate(loading) if x[1] == "livez")
    assert all(x[1] == "connect" for x in loading[:first_live])  # only before gunicorn listens
    for sent, what, status, retry_after in loading[first_live:]:
        if what == "livez":
            assert status == 200
        elif status == 200:  # sent just before the model was ready, answered just after
            assert sent > ready_logged - 1.0, (sent, ready_logged, what)
        else:
            assert what in ("readyz", "infer") and status == 503
            assert retry_after is not None and int(retry_after) >= 1
    after = [x for x in seen if x[0] > ready_at]
    assert after and all(x[2] == 200 for x in after), after
