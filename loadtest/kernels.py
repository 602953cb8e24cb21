"""Counting oneDNN kernel creations: the lines oneDNN prints for each primitive it creates
when ``ONEDNN_VERBOSE=profile_create`` is set before torch loads (``create:cache_miss``: a
kernel made, ``create:cache_hit``: one found in its primitive cache).

In process, `Creations` sends file descriptor 1 (where oneDNN's C code prints) to a file and
counts the new lines since the last call; for a server, `count_in_log` reads its log.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

MISS = "create:cache_miss"
ENV = {"ONEDNN_VERBOSE": "profile_create"}


def count_in_text(text: str) -> int:
    """Kernel creations (cache misses) among oneDNN's lines in `text`."""
    return sum(1 for line in text.splitlines() if MISS in line)


class Creations:
    """oneDNN's verbose lines of this process, counted between calls to `take`. Python's own
    `sys.stdout` moves to a copy of the original descriptor, so prints still show."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._sink = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115  (open while counting)
        saved = os.dup(1)
        sys.stdout = os.fdopen(saved, "w", buffering=1)
        os.dup2(self._sink.fileno(), 1)
        self._libc = ctypes.CDLL(None)
        self._offset = 0

    def take(self) -> int:
        """Creations since the last call (or since this object was made)."""
        self._libc.fflush(None)
        self._sink.seek(self._offset)
        data = self._sink.read()
        self._offset += len(data)
        return count_in_text(data.decode(errors="replace"))


def count_in_log(path: Path, after: int = 0) -> tuple[int, int]:
    """Creations in a server's log file from byte `after` on, and the file's length then."""
    data = path.read_bytes()
    return count_in_text(data[after:].decode(errors="replace")), len(data)
