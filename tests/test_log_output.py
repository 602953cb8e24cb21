"""What the server writes to stderr: nothing alarming on a clean stop, and its log format.

LOG_FORMAT unset: readable console lines when stderr is a terminal (`make run` in a shell),
one JSON object per line otherwise (a container, a pipe, a file); the setting overrides both.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import ServerProcess, free_port

from service.settings import Settings

# Words an operator reads as trouble. A clean stop's lines are the start and stop notices.
ALARMING = re.compile(
    r"error|errno|bad file descriptor|was sent|sigterm|killed|exception|traceback|timeout|fail",
    re.IGNORECASE,
)


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(
    ("tty", "setting", "expected"),
    [
        (True, None, "console"),
        (False, None, "json"),
        (True, "json", "json"),
        (False, "console", "console"),
    ],
)
def test_log_format_follows_the_terminal_unless_set(
    monkeypatch: pytest.MonkeyPatch, tty: bool, setting: str | None, expected: str
) -> None:
    monkeypatch.setattr(sys, "stderr", _Stream(tty))
    if setting is None:
        monkeypatch.delenv("LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("LOG_FORMAT", setting)
    assert Settings().log_format == expected


def test_log_format_is_json_without_a_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOG_FORMAT", raising=False)
    monkeypatch.setattr(sys, "stderr", None)
    assert Settings().log_format == "json"


@pytest.mark.server
def test_a_clean_stop_logs_nothing_alarming(
    start_server: Callable[..., ServerProcess], tiny_models: dict[str, Path]
) -> None:
    """Start, serve, SIGTERM: exit 0, every line JSON at level info, and no line that reads as
    trouble (each stop used to log `Error while closing socket [Errno 9] Bad file descriptor`
    and `Worker (pid:N) was sent SIGTERM!`). The worker finishes its own shutdown."""
    server = start_server(MODEL_ID=str(tiny_models["text-classification"]))
    server.wait_ready()
    assert server.post(content="a calm sentence").status_code == 200
    assert server.terminate() == 0
    lines = [json.loads(line) for line in server.log().splitlines()]
    events = [line["event"] for line in lines]
    assert "Application shutdown complete." in events, events
    assert events[-1] == "Shutting down: Master", events
    assert {line["level"] for line in lines} == {"info"}, lines
    alarming = [event for event in events if ALARMING.search(event)]
    assert not alarming, alarming


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """What the terminal showed until `needle` appeared (or `timeout` seconds passed)."""
    seen = b""
    until = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
    return seen


@pytest.mark.server
@pytest.mark.parametrize("setting", [None, "json"])
def test_on_a_terminal_lines_are_readable_unless_json_is_asked_for(
    tiny_models: dict[str, Path], setting: str | None
) -> None:
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port)}
    env["MODEL_ID"] = str(tiny_models["text-classification"])
    env.pop("LOG_FORMAT", None)
    if setting is not None:
        env["LOG_FORMAT"] = setting
    leader, follower = os.openpty()
    script = Path(sys.executable).with_name("pipeline-server")
    proc = subprocess.Popen([str(script)], env=env, stdout=follower, stderr=follower)
    os.close(follower)
    try:
        shown = _read_until(leader, b"Booting worker", timeout=60).decode(errors="replace")
    finally:
        proc.send_signal(signal.SIGTERM)
        _read_until(leader, b"Shutting down: Master", timeout=60)
        proc.wait(60)
        os.close(leader)
    lines = [line for line in shown.splitlines() if line.strip()]
    listening = next(line for line in lines if f"Listening at: http://127.0.0.1:{port}" in line)
    if setting == "json":
        assert json.loads(listening)["logger"] == "gunicorn.error"
    else:
        assert not listening.startswith("{"), listening
        assert re.match(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[info\s*\] Listening at", listening), listening
        assert "[gunicorn.error]" in listening
