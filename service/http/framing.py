"""Where each request of an HTTP/1.1 byte stream begins and ends (RFC 9112 §6.3, §7.1).

The edge (`service/http/bounded.py`) measures every request head before llhttp parses it: llhttp has
no size limit of its own and its callbacks carry no offsets, so the edge cuts the stream into
heads and bodies itself and feeds llhttp one part at a time. The framer only finds the cuts;
llhttp still validates every byte, and the edge checks that llhttp ended each head and each
message exactly where the framer did (any disagreement is refused).

A chunked body's size lines and trailer section are bounded like a head: llhttp bounds
neither, and uvicorn appends trailer fields to the request's headers.
"""

from __future__ import annotations

import re
from enum import Enum, auto

_END = b"\r\n\r\n"  # llhttp accepts no bare LF or CR (checked in tests/http/test_edge.py)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")  # llhttp refuses more (overflow)


class Step(Enum):
    """What `Framer.take` found at the end of the bytes it took."""

    MORE = auto()  # nothing: the current part goes on in the next read
    HEAD_END = auto()  # the request head ended; call `Framer.start_body`
    MESSAGE_END = auto()  # the request ended (its body, or its trailer section)
    TOO_LARGE = auto()  # the head, a chunk size line or the trailers would pass the bound
    MALFORMED = auto()  # a chunk size line that is not hex digits (llhttp refuses it too)


class _Part(Enum):
    HEAD = auto()
    BODY = auto()  # Content-Length bytes
    CHUNK_LINE = auto()
    CHUNK_DATA = auto()  # a chunk's data and its CRLF
    TRAILERS = auto()
    CLOSED = auto()  # after the last request of the connection: nothing is parsed


class Framer:
    """Cuts one connection's request stream; `limit` bounds each head (request line, header
    lines and the final CRLF CRLF, empty lines before the request line included), each chunk
    size line and each trailer section, in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._part = _Part.HEAD
        self._used = 0  # bytes of the current head or trailer section so far
        self._started = False  # a byte of the request line was seen (empty lines come first)
        self._tail = b""  # the last bytes of the head so far: a CRLF CRLF may span two reads
        self._left = 0  # bytes left of the Content-Length body or of the chunk and its CRLF
        self._line = bytearray()  # the chunk size line so far

    @property
    def idle(self) -> bool:
        """No byte of the next request seen yet."""
        return self._part is _Part.HEAD and self._used == 0

    @property
    def in_head(self) -> bool:
        return self._part is _Part.HEAD

    @property
    def in_body(self) -> bool:
        """A request's head has ended and its body (or its trailer section) has not."""
        return self._part not in (_Part.HEAD, _Part.CLOSED)

    @property
    def closed(self) -> bool:
        return self._part is _Part.CLOSED

    def close(self) -> None:
        """No more requests on this connection (refused, or its last one ended)."""
        self._part = _Part.CLOSED

    def start_body(self, content_length: int, chunked: bool) -> Step:
        """After HEAD_END: the body's framing, as llhttp read it from the head. Returns
        MESSAGE_END for a request without a body, else MORE."""
        if chunked:
            self._part = _Part.CHUNK_LINE
        elif content_length:
            self._part, self._left = _Part.BODY, content_length
        else:
            return Step.MESSAGE_END
        return Step.MORE

    def take(self, data: bytes, start: int) -> tuple[int, Step]:
        """The bytes `data[start:end]` that belong to the current request up to the next step,
        and that step. On TOO_LARGE and MALFORMED, `end` is where the trouble starts."""
        if self._part is _Part.HEAD:
            return self._fields(data, start, Step.HEAD_END)
        if self._part is _Part.BODY:
            end = start + min(self._left, len(data) - start)
            self._left -= end - start
            if self._left:
                return end, Step.MORE
            self._part = _Part.HEAD
            return end, Step.MESSAGE_END
        return self._chunks(data, start)

    def _fields(self, data: bytes, start: int, step: Step) -> tuple[int, Step]:
        """A head or a trailer section: field lines up to an empty line."""
        i, n = start, len(data)
        while not self._started and i < n and data[i] in b"\r\n":
            i += 1  # empty lines before the request line (RFC 9112 §2.2), counted in the head
        self._started = i < n or self._started
        if self._tail and (found := (self._tail + data[i : i + 3]).find(_END)) >= 0:
            end = i + found + 4 - len(self._tail)  # the CRLF CRLF began in an earlier read
        else:
            found = data.find(_END, i)
            end = found + 4 if found >= 0 else -1
        if end < 0:  # not in this read
            self._used += n - start
            if self._started:
                self._tail = (self._tail + data[max(i, n - 3) :])[-3:]
            return (n, Step.MORE) if self._used <= self.limit else (start, Step.TOO_LARGE)
        if self._used + end - start > self.limit:
            return start, Step.TOO_LARGE
        self._used, self._started, self._tail = 0, False, b""
        if self._part is _Part.TRAILERS:
            self._part = _Part.HEAD
            return end, Step.MESSAGE_END
        return end, step

    def _chunks(self, data: bytes, start: int) -> tuple[int, Step]:
        i, n = start, len(data)
        while i < n:
            if self._part is _Part.CHUNK_DATA:
                took = min(self._left, n - i)
                self._left -= took
                i += took
                if not self._left:
                    self._part = _Part.CHUNK_LINE
                continue
            if self._part is _Part.TRAILERS:
                return self._fields(data, i, Step.MESSAGE_END)
            newline = data.find(b"\n", i)
            stop = n if newline < 0 else newline + 1
            if len(self._line) + stop - i > self.limit:
                return i, Step.TOO_LARGE
            self._line += data[i:stop]
            i = stop
            if newline >= 0 and not self._end_of_chunk_line():
                return i, Step.MALFORMED
        return n, Step.MORE

    def _end_of_chunk_line(self) -> bool:
        size = bytes(self._line).split(b";", 1)[0].removesuffix(b"\r\n")
        self._line.clear()
        if not _CHUNK_SIZE.fullmatch(size):
            return False
        if left := int(size, 16):
            self._part, self._left = _Part.CHUNK_DATA, left + 2
        else:  # the last chunk: its line's CRLF may also end an empty trailer section
            self._part, self._started, self._tail = _Part.TRAILERS, True, b"\r\n"
        return True
