"""The transport a request's answer is written to: an answer's head goes out with its body."""

from __future__ import annotations

import asyncio

from service.http.bounded import _AnswerTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed


def answer_transport() -> tuple[_AnswerTransport, Recorder, list[str]]:
    raw, closes = Recorder(), []
    return _AnswerTransport(raw, lambda: closes.append("closed")), raw, closes


def test_a_head_and_its_body_are_one_write_answer_after_answer() -> None:
    transport, raw, _ = answer_transport()
    for body in (b"{}", b"[]"):
        transport.write(HEAD)
        assert raw.writes == [HEAD + b"{}"] * (body == b"[]")  # held until the body
        transport.write(body)
        transport.answered()
    assert raw.writes == [HEAD + b"{}", HEAD + b"[]"]


def test_a_streamed_body_goes_out_part_by_part_after_the_first() -> None:
    transport, raw, _ = answer_transport()
    transport.write(HEAD)
    transport.write(memoryview(b"ab"))
    transport.write(b"cd")
    transport.answered()
    assert raw.writes == [HEAD + b"ab", b"cd"]


def test_an_answer_without_a_body_is_written_when_it_ends_or_closes() -> None:
    transport, raw, closes = answer_transport()
    transport.write(HEAD)  # HEAD or 204: uvicorn writes no body
    transport.answered()
    transport.write(HEAD)
    transport.close()  # `connection: close` after it
    assert raw.writes == [HEAD, HEAD] and closes == ["closed"]


def test_100_continue_goes_out_at_once_and_the_answer_follows_whole() -> None:
    transport, raw, _ = answer_transport()
    transport.write(CONTINUE)
    assert raw.writes == [CONTINUE]
    transport.write(HEAD)
    transport.write(b"{}")
    assert raw.writes == [CONTINUE, HEAD + b"{}"]
