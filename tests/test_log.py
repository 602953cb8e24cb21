"""The log writer thread (`service.log.LineWriter`): every line, in order, in few writes."""

from __future__ import annotations

import io
import threading
import time

from service.log import _GATHER_S, LineWriter


class _Target(io.StringIO):
    """A stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_from_several_threads_arrive_whole_and_in_order_in_few_writes() -> None:
    """400 lines from two threads over ~0.1 s (as a loaded server writes them): each thread's
    lines whole and in its order, in few writes (the writer gathers for `_GATHER_S` once
    woken), not one per line (about 250 writes without it, here)."""
    target = _Target()
    writer = LineWriter(target)

    def emit(name: str) -> None:
        for i in range(200):
            writer.write(f"{name} {i}\n")
            time.sleep(0.0005)

    threads = [threading.Thread(target=emit, args=(n,)) for n in ("a", "b")]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emitted_s = time.monotonic() - started
    writer.close()
    lines = target.getvalue().splitlines()
    assert len(lines) == 400
    for name in ("a", "b"):
        assert [x for x in lines if x.startswith(name + " ")] == [f"{name} {i}" for i in range(200)]
    # One write per `_GATHER_S` of emitting at most, plus the first and the last.
    assert target.writes <= emitted_s / _GATHER_S + 3, (target.writes, emitted_s)


def test_a_lone_line_is_written_within_the_gather_time() -> None:
    target = _Target()
    writer = LineWriter(target)
    writer.write("alone\n")
    until = time.monotonic() + 1
    while target.getvalue() != "alone\n" and time.monotonic() < until:
        time.sleep(0.001)
    assert target.getvalue() == "alone\n" and target.writes == 1
    writer.close()
