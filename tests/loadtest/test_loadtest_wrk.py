"""wrk (loadtest.wrk) against a trivial local server: bodies cycled in order, statuses counted."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from loadtest import wrk

needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk: apt-get install wrk")


class _Stub(BaseHTTPRequestHandler):
    """POST: every third answer is a 503, the others echo the body; GET: 200 ``ok``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as wrk expects
    bodies: ClassVar[list[bytes]] = []
    count: ClassVar[int] = 0
    lock = threading.Lock()

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with _Stub.lock:
            _Stub.count += 1
            n = _Stub.count
            if len(_Stub.bodies) < 50:
                _Stub.bodies.append(body)
        self._answer(503 if n % 3 == 0 else 200, body)

    def do_GET(self) -> None:
        self._answer(200, b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[str]:
    _Stub.bodies, _Stub.count = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@needs_wrk
def test_wrk_cycles_bodies_in_order_and_counts_statuses(stub: str) -> None:
    bodies = [json.dumps({"inputs": f"text {i}"}).encode() for i in range(5)]
    res = wrk.run(stub, bodies, 1, 1, count_statuses=True)
    assert res.requests > 20 and res.duration_s >= 1
    # One connection: the list in order, cycling (wrk calls request() once before it starts,
    # so the first body sent may be the second of the list).
    start = bodies.index(_Stub.bodies[0])
    assert _Stub.bodies[:10] == (bodies[start:] + bodies * 3)[:10]
    assert sum(res.statuses.values()) == res.requests
    assert res.statuses[503] == res.errors["status"]
    assert 0.25 < res.statuses[503] / res.requests < 0.4
    assert res.ok == res.statuses[200] and res.ok_per_s == pytest.approx(res.ok / res.duration_s)
    assert 0 < res.latency_ms["p50"] <= res.latency_ms["p99"] <= res.latency_ms["max"]
    assert res.cpu_s > 0


@needs_wrk
def test_wrk_get_without_counting_still_counts_non_2xx(stub: str) -> None:
    res = wrk.run(stub, None, 2, 1)
    assert res.statuses == {} and res.errors["status"] == 0 and res.ok == res.requests > 0


def test_bodies_with_newlines_are_refused() -> None:
    with pytest.raises(ValueError, match="newline"):
        wrk.run("http://127.0.0.1:9/", [b"two\nlines"], 1, 1)


def test_parse_reads_the_done_line() -> None:
    line = (
        wrk.MARKER + '{"duration_us": 2000000, "requests": 10, "bytes": 100, "errors": '
        '{"connect": 0, "read": 0, "write": 0, "status": 4, "timeout": 1}, "latency_us": '
        '{"mean": 1500.0, "max": 9000, "p50": 1000, "p90": 2000, "p95": 3000, "p99": 8000}, '
        '"statuses": {"200": 6, "503": 4}}'
    )
    res = wrk.parse("Running 2s test\n" + line + "\nRequests/sec: 5\n", 4, 1, cpu_s=0.5)
    assert res.requests_per_s == 5 and res.ok == 6 and res.per_s(503) == 2
    assert res.latency_ms["p95"] == 3.0 and res.errors["timeout"] == 1
    summary = res.summary()
    assert summary["p99_ms"] == 8.0 and summary["client_cpu_ms_per_request"] == 50.0
    with pytest.raises(RuntimeError, match="no result line"):
        wrk.parse("PANIC: unprotected error in call to Lua API", 1, 1)


def test_script_counts_and_backs_off_only_when_asked() -> None:
    plain = wrk.script(None, "GET", {}, count_statuses=False)
    assert "function response" not in plain and "function delay" not in plain
    counted = wrk.script(None, "GET", {"X-A": "b"}, count_statuses=True)
    assert "function response" in counted and "function delay" not in counted
    assert 'wrk.headers["X-A"] = "b"' in counted
    polite = wrk.script(None, "GET", {}, count_statuses=False, backoff_ms=50)
    assert "function delay" in polite and "backoff_ms, shed = 50" in polite


def test_missing_wrk_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="apt-get install wrk"):
        wrk.executable()
