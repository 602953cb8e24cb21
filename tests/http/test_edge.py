"""The HTTP edge on the real server, with raw sockets: exact head bound, head
deadline, connection bound, RFC 9112 refusals, the refusal metric, one worker throughout.

One server for the module (REQUEST_HEAD_TIMEOUT_S=1, MAX_CONNECTIONS=20, the default 64 KiB
head bound); each test checks the metric's increase for its own reason.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import ServerProcess

pytestmark = pytest.mark.server

BOUND = 64 * 1024
HEAD_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 20
MARGIN_S = 1.5  # scheduling slack on a shared 2-core machine
Reply = tuple[int, dict[str, str], bytes]


@pytest.fixture(scope="module")
def server(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = {
        "MODEL_ID": str(tiny_models["text-classification"]),
        "REQUEST_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "MAX_BODY_BYTES": str(BODY_LIMIT),
    }
    proc = ServerProcess(env, tmp_path_factory.mktemp("edge") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.terminate()


def refused(server: ServerProcess, reason: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    pattern = rf'^pipeline_server_http_refused_total{{reason="{reason}"}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_all(sock: socket.socket, timeout: float = 10) -> tuple[bytes, bool]:
    """Everything until the server's FIN (closed=True) or `timeout` seconds (closed=False)."""
    sock.settimeout(timeout)
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except TimeoutError:
        return reply, False
    except ConnectionResetError:
        pass
    return reply, True


def one_answer(sock: socket.socket, timeout: float = 10) -> bytes:
    """Bytes until one whole answer has arrived (its head and Content-Length bytes of body:
    the server may write them in two pieces)."""
    sock.settimeout(timeout)
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply) < _answer_length(reply):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def _answer_length(reply: bytes) -> int:
    head, _, _ = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


def parse(reply: bytes) -> list[Reply]:
    """The HTTP/1.1 answers in `reply` (each with a Content-Length)."""
    answers = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        answers.append((int(lines[0].split()[1]), headers, rest[:length]))
        reply = rest[length:]
    return answers


def exchange(server: ServerProcess, data: bytes) -> tuple[list[Reply], bool]:
    with connect(server) as sock:
        sock.sendall(data)
        reply, closed = read_all(sock)
    return parse(reply), closed


def post(body: bytes = b"a good sentence", pad: int = 0, **extra: str) -> bytes:
    """POST / with a text body; `pad` bytes of an X-Pad header make the head that much longer."""
    lines = [b"POST / HTTP/1.1", b"Host: 127.0.0.1", b"Content-Type: text/plain"]
    lines.append(b"Content-Length: %d" % len(body))
    lines += [f"{k}: {v}".encode("latin-1") for k, v in extra.items()]
    if pad:
        lines.append(b"X-Pad: " + b"p" * pad)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def post_with_head_of(size: int, body: bytes = b"a good sentence") -> bytes:
    """POST / whose head (request line to the final CRLF CRLF) is exactly `size` bytes."""
    bare = post(body, pad=1)
    head = bare[: -len(body)]
    data = post(body, pad=1 + size - len(head))
    assert data.index(b"\r\n\r\n") + 4 == size
    return data


GET_LIVEZ = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
H = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"

# What llhttp refuses by itself (400), and what the edge adds (no Host, two Hosts, chunked in
# HTTP/1.0: 400; a transfer coding besides chunked: 501).
MALFORMED = {
    "cl-then-te": H + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te-then-cl": H + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "cl-not-a-number": H + b"Content-Length: 5x\r\n\r\nhello",
    "cl-negative": H + b"Content-Length: -5\r\n\r\nhello",
    "cl-list": H + b"Content-Length: 5, 5\r\n\r\nhello",
    "two-different-cl": H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "two-equal-cl": H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "obs-fold": H + b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "bare-lf": b"GET /livez HTTP/1.1\nHost: 127.0.0.1\n\n",
    "bare-cr": b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\rX: y\r\n\r\n",
    "no-host": b"GET /livez HTTP/1.1\r\n\r\n",
    "two-hosts": b"GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "te-in-http-1.0": b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad-chunk-size": H + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
}
# Control bytes in a header value, one per class: NUL, SOH..BS, LF-class (VT, FF), SO..US,
# ESC, DEL.
CONTROL_BYTES = [0x00, 0x01, 0x08, 0x0B, 0x0C, 0x0E, 0x1B, 0x1F, 0x7F]


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_requests_get_400_and_a_closed_connection(
    server: ServerProcess, name: str
) -> None:
    before = refused(server, "bad_request")
    answers, closed = exchange(server, MALFORMED[name])
    assert [a[0] for a in answers] == [400] and closed, (answers, closed)
    _, headers, body = answers[0]
    assert headers["connection"] == "close" and "x-request-id" in headers
    assert json.loads(body)["error_type"] == "bad_request"
    assert refused(server, "bad_request") == before + 1


def test_a_transfer_coding_besides_chunked_gets_501(server: ServerProcess) -> None:
    data = H + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    answers, closed = exchange(server, data)
    assert [a[0] for a in answers] == [501] and closed


@pytest.mark.parametrize("byte", CONTROL_BYTES, ids=hex)
def test_control_bytes_in_a_header_value_get_400(server: ServerProcess, byte: int) -> None:
    before = refused(server, "bad_request")
    answers, closed = exchange(server, post(**{"X-Note": f"a{chr(byte)}b"}))
    assert [a[0] for a in answers] == [400] and closed, answers
    assert b"Invalid header value char" in answers[0][2]
    assert refused(server, "bad_request") == before + 1


def test_htab_and_obs_text_in_a_header_value_are_served(server: ServerProcess) -> None:
    answers, closed = exchange(
        server, post(**{"X-Note": "a\tb\x80\xe9\xff", "Connection": "close"})
    )
    assert [a[0] for a in answers] == [200] and closed


@pytest.mark.parametrize("dribbled", [False, True], ids=["one-write", "dribbled"])
def test_a_head_of_exactly_the_bound_is_served_and_one_byte_more_gets_431(
    server: ServerProcess, dribbled: bool
) -> None:
    before = refused(server, "head_too_large")
    for size, status in ((BOUND, 200), (BOUND + 1, 431)):
        data = post_with_head_of(size)
        head_end = data.index(b"\r\n\r\n") + 4
        with connect(server) as sock:
            if dribbled:  # 4 KiB writes 5 ms apart, then the head's last 16 bytes one by one
                cut = head_end - 16
                for i in range(0, cut, 4096):
                    sock.sendall(data[i : min(i + 4096, cut)])
                    time.sleep(0.005)
                for i in range(cut, head_end):
                    sock.sendall(data[i : i + 1])
                    time.sleep(0.005)
                with contextlib.suppress(OSError):
                    sock.sendall(data[head_end:])
            else:
                sock.sendall(data)
            reply, closed = read_all(sock, timeout=1 if status == 200 else 10)
        answers = parse(reply)
        assert [a[0] for a in answers] == [status], (size, answers)
        assert closed == (status == 431)  # the served one stays open (keep-alive)
    assert refused(server, "head_too_large") == before + 1


def test_a_pipelined_request_over_the_bound_gets_431_after_the_first_answer(
    server: ServerProcess,
) -> None:
    before = refused(server, "head_too_large")
    first, second, third = post(), post_with_head_of(BOUND), post_with_head_of(BOUND + 1)
    answers, closed = exchange(server, first + second + third)
    assert [a[0] for a in answers] == [200, 200, 431] and closed
    assert refused(server, "head_too_large") == before + 1


CHUNKED = H + b"Transfer-Encoding: chunked\r\n\r\n5;x=1\r\na goo\r\nA\r\nd sentence\r\n0\r\n"


def test_a_chunked_request_and_the_one_pipelined_after_it_are_served(
    server: ServerProcess,
) -> None:
    data = CHUNKED + b"X-Trailer: 1\r\n\r\n" + post(Connection="close")
    answers, closed = exchange(server, data)
    assert [a[0] for a in answers] == [200, 200] and closed
    assert answers[0][2] == answers[1][2]  # the same text, chunked or not


def test_expect_100_continue_a_head_request_and_a_post_on_one_connection(
    server: ServerProcess,
) -> None:
    """The answer's head is written with its body: 100 Continue still goes out before the
    body is sent, and an answer without a body (HEAD) still goes out whole."""
    body = b"a good sentence"
    with connect(server) as sock:
        head = post(body, Expect="100-continue")[: -len(body)]
        sock.sendall(head)
        sock.settimeout(10)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        [(status, _, first)] = parse(one_answer(sock))
        sock.sendall(b"HEAD /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"\r\n\r\n"), reply
        sock.sendall(post(body))
        [(again, _, second)] = parse(one_answer(sock))
    assert status == again == 200 and first == second and first.startswith(b'[[{"label":')


def test_a_trailer_section_over_the_bound_gets_431(server: ServerProcess) -> None:
    before = refused(server, "head_too_large")
    answers, closed = exchange(server, CHUNKED + b"X-Trailer: " + b"t" * BOUND + b"\r\n\r\n")
    assert [a[0] for a in answers] == [431] and closed
    assert refused(server, "head_too_large") == before + 1


def test_a_slow_head_gets_408_at_its_deadline(server: ServerProcess) -> None:
    before = refused(server, "head_timeout")
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(0.25)
        first = b""
        for i in range(20):  # a header line every 0.25 s (slowloris) until the server answers
            try:
                first = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
        elapsed = time.monotonic() - started
        rest, closed = read_all(sock)
    answers = parse(first + rest)
    assert [a[0] for a in answers] == [408] and closed
    assert json.loads(answers[0][2])["error_type"] == "head_timeout"
    assert HEAD_TIMEOUT_S - 0.1 < elapsed < HEAD_TIMEOUT_S + MARGIN_S
    assert refused(server, "head_timeout") == before + 1


def test_the_deadline_runs_from_the_first_byte_of_the_next_request(server: ServerProcess) -> None:
    with connect(server) as sock:
        sock.sendall(GET_LIVEZ)
        assert parse(one_answer(sock))[0][0] == 200
        time.sleep(HEAD_TIMEOUT_S + 0.5)  # idle keep-alive: uvicorn's keep-alive timeout, 75 s
        sock.sendall(GET_LIVEZ)
        assert parse(one_answer(sock))[0][0] == 200
        started = time.monotonic()
        sock.sendall(b"GET /livez HTTP/1.1\r\n")  # never finished
        reply, closed = read_all(sock)
        elapsed = time.monotonic() - started
    assert [a[0] for a in parse(reply)] == [408] and closed
    assert HEAD_TIMEOUT_S - 0.1 < elapsed < HEAD_TIMEOUT_S + MARGIN_S


def test_a_connection_that_never_sends_a_byte_is_closed_at_the_deadline(
    server: ServerProcess,
) -> None:
    before = refused(server, "head_timeout")
    with connect(server) as sock:
        started = time.monotonic()
        reply, closed = read_all(sock)
        elapsed = time.monotonic() - started
    assert [a[0] for a in parse(reply)] == [408] and closed
    assert HEAD_TIMEOUT_S - 0.1 < elapsed < HEAD_TIMEOUT_S + MARGIN_S
    assert refused(server, "head_timeout") == before + 1


def test_slow_heads_are_all_closed_while_the_server_keeps_serving(server: ServerProcess) -> None:
    before = refused(server, "head_timeout")
    socks = [connect(server) for _ in range(MAX_CONNECTIONS - 4)]
    try:
        for sock in socks:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert httpx.get(server.url + "/livez", timeout=5).status_code == 200
        assert httpx.post(server.url + "/", content="a good sentence").status_code == 200
        results = [read_all(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert all(closed and parse(reply)[0][0] == 408 for reply, closed in results)
    assert refused(server, "head_timeout") == before + len(socks)


def test_at_the_bound_an_idle_keep_alive_connection_makes_room(server: ServerProcess) -> None:
    """Idle keep-alive connections (a flood of them, say) never lock new clients out: at the
    bound one of them is closed, and the new connection (a probe) is served."""
    time.sleep(0.2)  # earlier tests' connections are all closed on the server's side too
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:  # each one is an idle keep-alive connection after its answer
            sock.sendall(GET_LIVEZ)
        replies = [read_all(sock, timeout=0.5) for sock in held]
        assert all(parse(reply)[0][0] == 200 and not closed for reply, closed in replies)
        with connect(server) as extra:
            extra.sendall(GET_LIVEZ)
            assert parse(read_all(extra, timeout=0.5)[0])[0][0] == 200
        closed_now = [read_all(sock, timeout=0.5)[1] for sock in held]
        assert sum(closed_now) == 1  # the room came from one idle connection, closed
    finally:
        for sock in held:
            sock.close()


def test_a_connection_over_the_bound_gets_503_at_once(server: ServerProcess) -> None:
    """When every connection is busy with a request (here: heads still arriving), one more is
    answered 503 at once, without reading it."""
    before = refused(server, "connection_limit")
    time.sleep(0.2)
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:  # a head in progress: not idle, never closed to make room
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.1)
        with connect(server) as extra:
            started = time.monotonic()
            reply, closed = read_all(extra)
            elapsed = time.monotonic() - started
        answers = parse(reply)
        assert [a[0] for a in answers] == [503] and closed and elapsed < 0.5
        headers = answers[0][1]
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert json.loads(answers[0][2])["error_type"] == "connection_limit"
        held.pop().close()  # a slot frees: new connections are served
        assert _eventually_ok(server, "/livez")
        assert httpx.post(server.url + "/", content="a good sentence").status_code == 200
    finally:
        for sock in held:
            sock.close()
    assert refused(server, "connection_limit") == before + 1


def _eventually_ok(server: ServerProcess, path: str) -> bool:
    for _ in range(50):
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.url + path, timeout=5).status_code == 200:
                return True
        time.sleep(0.02)
    return False


def test_refusals_are_logged_at_most_once_a_second_per_reason(server: ServerProcess) -> None:
    def lines() -> int:
        logged = [json.loads(x) for x in server.log().splitlines() if x.startswith("{")]
        return sum(x.get("event") == "http_refused" for x in logged)

    time.sleep(1.1)  # a fresh second for every reason
    before, refused_before = lines(), refused(server, "bad_request")
    started = time.monotonic()
    for _ in range(30):
        exchange(server, MALFORMED["cl-then-te"])
    elapsed = time.monotonic() - started
    time.sleep(0.2)
    assert refused(server, "bad_request") == refused_before + 30
    assert 1 <= lines() - before <= int(elapsed) + 1


# -- bodies over MAX_BODY_BYTES (1 MiB here): the 413 reaches a client still sending -------------
BODY_LIMIT = 1024 * 1024
LINGER_S = 2.0  # service.http.bounded._LINGER_S
LINGER_BYTES = 4 * BODY_LIMIT  # service.http.bounded._LINGER_BODIES bodies


def test_a_client_that_sends_its_whole_body_before_reading_gets_the_413(
    server: ServerProcess,
) -> None:
    """Python's http.client writes the whole body, then reads. The server answers 413 from
    the head, half-closes, reads and drops the rest, then closes: the client's upload ends
    and it reads the JSON error (before, 4 of 10 such 2 MiB uploads met a broken pipe)."""
    for _ in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.request(
                "POST", "/", body=b"a" * (2 * BODY_LIMIT), headers={"Content-Type": "text/plain"}
            )
            response = conn.getresponse()
            body = json.loads(response.read())
            assert response.status == 413, body
            assert response.getheader("Connection") == "close"
            assert body["error_type"] == "payload_too_large"
            assert body["error"] == (
                f"body is {2 * BODY_LIMIT} bytes; the limit is {BODY_LIMIT} (MAX_BODY_BYTES)"
            )
            assert response.getheader("X-Request-ID") == body["request_id"]
        finally:
            conn.close()
    assert httpx.post(server.url + "/", content="a good sentence").status_code == 200


def _send_until_refused(sock: socket.socket, chunk: bytes, pause_s: float, limit_s: float) -> int:
    """Send `chunk` every `pause_s` seconds until the server's close refuses it; bytes sent."""
    sent = 0
    until = time.monotonic() + limit_s
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while time.monotonic() < until:
            sock.sendall(chunk)
            sent += len(chunk)
            time.sleep(pause_s)
        raise AssertionError(f"still accepting after {limit_s} s")
    return sent


def test_the_linger_after_a_413_is_bounded_in_time(server: ServerProcess) -> None:
    """A slow upload far over the limit: answered at once, then read for `LINGER_S`, closed."""
    with connect(server) as sock:
        sock.sendall(
            post(b"x" * 65536).replace(b"Content-Length: 65536", b"Content-Length: 9999999")
        )
        assert parse(one_answer(sock))[0][0] == 413
        started = time.monotonic()
        _send_until_refused(sock, b"x" * 1024, pause_s=0.05, limit_s=LINGER_S + 4 * MARGIN_S)
        closed_after = time.monotonic() - started
    assert LINGER_S - 0.5 <= closed_after <= LINGER_S + 4 * MARGIN_S


def test_the_linger_after_a_413_is_bounded_in_bytes(server: ServerProcess) -> None:
    """A fast upload far over the limit is read up to `LINGER_BYTES` (plus what the kernels'
    buffers hold), then closed, well before the time bound."""
    declared = 64 * BODY_LIMIT
    with connect(server) as sock:
        head = post(b"").replace(b"Content-Length: 0", b"Content-Length: %d" % declared)
        sock.sendall(head)
        assert parse(one_answer(sock))[0][0] == 413
        started = time.monotonic()
        sent = _send_until_refused(sock, b"x" * 65536, pause_s=0, limit_s=LINGER_S)
        closed_after = time.monotonic() - started
    assert LINGER_BYTES <= sent < declared / 2
    assert closed_after < LINGER_S - 0.5


def _shed_cpu_s(server: ServerProcess) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    match = re.search(r"^pipeline_server_shed_cpu_seconds_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_the_worker_binds_the_edge_to_the_apps_admission_policy(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Under gunicorn the edge decides with the app's admission policy: while the model loads, a
    POST gets its 503 from the head and what it cost is charged to the shed budget; so is the
    503 the app's gate gives a request through a proxy (X-Forwarded-For), which the edge hands
    over to the app. An edge without the policy would leave both to the app, uncharged."""
    env = {
        "MODEL_ID": str(tiny_models["text-classification"]),
        "MODEL_LOAD_DELAY_S": "6",
        "TORCH_NUM_THREADS": "1",
    }
    server = ServerProcess(env, tmp_path / "server.log")
    try:
        until = time.monotonic() + 60
        while not _eventually_ok(server, "/livez"):  # listening, the model still loading
            assert time.monotonic() < until, server.log()
        assert server.get("/readyz").status_code == 503
        before = _shed_cpu_s(server)
        at_edge = server.post(content="a good sentence")
        charged_at_edge = _shed_cpu_s(server)
        proxied = server.post(content="a good sentence", headers={"X-Forwarded-For": "10.1.2.3"})
        charged_in_app = _shed_cpu_s(server)
        assert server.get("/readyz").status_code == 503, "loaded too soon for this test"
    finally:
        server.terminate()
    for answer in (at_edge, proxied):
        assert answer.status_code == 503 and answer.json()["error_type"] == "not_ready"
    assert before == 0.0
    # one shed each, charged `budget._MIN_CHARGE_S` to `_MAX_CHARGE_S`
    assert 0.00025 - 1e-9 <= charged_at_edge - before <= 0.002 + 1e-9
    assert 0.00025 - 1e-9 <= charged_in_app - charged_at_edge <= 0.002 + 1e-9


def test_one_worker_served_it_all(server: ServerProcess) -> None:
    assert httpx.post(server.url + "/", content="a good sentence").status_code == 200
    log = server.log()
    assert log.count("Booting worker") == 1 and "WORKER TIMEOUT" not in log
