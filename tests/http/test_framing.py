"""The framer without a server: it cuts a request stream where llhttp does, in any split."""

from __future__ import annotations

import random

import httptools
import pytest

from service.http.framing import Framer, Step

GET = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED = CHUNKED_HEAD + b"5;ext=1\r\nhello\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\nX-T: 1\r\n\r\n"
BARE_LAST = CHUNKED_HEAD + b"3\r\nabc\r\n0\r\n\r\n"
STREAM = [b"\r\n" + GET, POST, CHUNKED, GET, BARE_LAST, POST]


class _Llhttp:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.headers: dict[bytes, bytes] = {}
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.events.append("head")

    def on_message_complete(self) -> None:
        self.events.append("message")


def _run(reads: list[bytes], limit: int = 65536) -> tuple[list[str], list[str], list[int]]:
    """Feed `reads` through the framer (part by part) into llhttp, as the edge does. Returns
    the framer's steps, llhttp's events and the size of each head."""
    framer, llhttp = Framer(limit), _Llhttp()
    steps: list[str] = []
    heads: list[int] = []
    head = 0
    for data in reads:
        start = 0
        while start < len(data):
            in_head = framer.in_head
            end, step = framer.take(data, start)
            assert step not in (Step.TOO_LARGE, Step.MALFORMED), step
            llhttp.parser.feed_data(data[start:end])
            head += end - start if in_head else 0
            start = end
            if step is Step.HEAD_END:
                heads.append(head)
                head = 0
                steps.append("head")
                length = int(llhttp.headers.get(b"content-length", b"0"))
                step = framer.start_body(length, b"transfer-encoding" in llhttp.headers)
            if step is Step.MESSAGE_END:
                steps.append("message")
    return steps, llhttp.events, heads


@pytest.mark.parametrize("seed", range(40))
def test_cuts_where_llhttp_does_in_any_split(seed: int) -> None:
    rng = random.Random(seed)
    stream = b"".join(STREAM)
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 40)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    steps, events, heads = _run(reads)
    assert steps == events == ["head", "message"] * len(STREAM)
    assert heads == [len(r.split(b"\r\n\r\n")[0]) + 4 for r in STREAM]


@pytest.mark.parametrize("one_read", [True, False])
def test_a_head_of_exactly_the_limit_passes_and_one_byte_more_does_not(one_read: bool) -> None:
    for size, expected in ((1024, Step.HEAD_END), (1025, Step.TOO_LARGE)):
        head = b"GET / HTTP/1.1\r\nHost: x\r\nX: "
        head += b"a" * (size - len(head) - 4) + b"\r\n\r\n"
        assert len(head) == size
        framer = Framer(1024)
        reads = [head] if one_read else [head[i : i + 1] for i in range(size)]
        for data in reads:
            _, step = framer.take(data, 0)
            if step is not Step.MORE:
                break
        assert step is expected


def test_a_pipelined_second_head_is_measured_on_its_own() -> None:
    second = b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 2000 + b"\r\n\r\n"
    framer = Framer(2000)
    data = POST + second
    end, step = framer.take(data, 0)
    assert step is Step.HEAD_END and framer.start_body(5, False) is Step.MORE
    end, step = framer.take(data, end)
    assert (end, step) == (len(POST), Step.MESSAGE_END)
    assert framer.take(data, end)[1] is Step.TOO_LARGE


def test_chunk_lines_and_trailers_are_bounded() -> None:
    for body in (b"5;" + b"e" * 2000 + b"\r\nhello\r\n0\r\n\r\n", b"0\r\nX: " + b"t" * 2000):
        framer = Framer(1024)
        end, _ = framer.take(CHUNKED_HEAD + body, 0)
        framer.start_body(0, True)
        assert framer.take(CHUNKED_HEAD + body, end)[1] is Step.TOO_LARGE


def test_a_chunk_size_that_is_not_hex_is_malformed() -> None:
    framer = Framer(1024)
    data = CHUNKED_HEAD + b"0x5\r\nhello\r\n0\r\n\r\n"
    end, _ = framer.take(data, 0)
    framer.start_body(0, True)
    assert framer.take(data, end)[1] is Step.MALFORMED
