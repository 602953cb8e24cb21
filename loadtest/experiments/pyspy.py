"""py-spy against the server's worker: raw stack samples per thread, and what they add up to.

``py-spy record --format raw --threads`` writes one line per distinct stack,
``thread (<tid>): <name>;<outermost frame>;...;<innermost frame> <count>``, each frame
``function (file:line)``. It runs ``--nonblocking`` (it reads the process's memory without
stopping it, so stacks can now and then be torn, but the server is not slowed by the pauses),
except with ``native`` (C frames too), which needs the pauses.

Two kinds of record:

- CPU: without ``--idle``, a thread is sampled only while the OS has it running, so a thread's
  samples / (rate x seconds) is its share of a core, and its stacks say where that goes;
- GIL (``--gil``): only the thread holding the GIL at each sample is kept, so a thread's samples
  / (rate x seconds) is the share of the time it held the GIL.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loadtest import servers

_LINE = re.compile(r"^thread \((?P<tid>\d+|0x[0-9a-f]+)\): (?P<rest>.*) (?P<count>\d+)$")
_LINENO = re.compile(r":\d+\)$")
#: Inclusive tops leave out the threads' entry frames (by file) and any function on at least
#: ``ENTRY_SHARE`` of a thread's stacks (:func:`top`).
ENTRY_FILES = (
    "(gunicorn/",
    "(<frozen runpy>",
    "(uvicorn_worker/",
    "(uvicorn/_compat.py",
    "(asyncio/runners.py",
    "(threading.py",
)
ENTRY_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class Stack:
    """One distinct stack of one thread and how many samples had it (frames outermost first)."""

    tid: int
    thread: str
    frames: tuple[str, ...]
    count: int


def executable() -> str:
    """The py-spy binary beside this Python (the ``dev`` extras install it), else on PATH."""
    try:
        return servers.console_script("py-spy")
    except FileNotFoundError:
        raise FileNotFoundError("py-spy is not installed: pip install -e '.[dev]'") from None


def parse_raw(text: str) -> list[Stack]:
    """The stacks of a raw record (lines that do not parse are skipped)."""
    out: list[Stack] = []
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        name, *frames = match["rest"].split(";")
        out.append(Stack(int(match["tid"], 0), name, tuple(frames), int(match["count"])))
    return out


def record_command(
    pid: int, seconds: int, out: Path, rate: int = 100, gil: bool = False, native: bool = False
) -> list[str]:
    """The py-spy command line for one raw record of ``pid``."""
    cmd = [executable(), "record", "--pid", str(pid), "--format", "raw", "--threads"]
    cmd += ["--rate", str(rate), "--duration", str(seconds), "-o", str(out)]
    # --native (C frames: uvloop, orjson, tokenizers) needs py-spy to pause the process at
    # every sample; without it, py-spy reads memory while the process runs.
    return cmd + (["--gil"] if gil else []) + (["--native"] if native else ["--nonblocking"])


class Recording:
    """A py-spy record running in the background; :meth:`stacks` waits for it and parses."""

    def __init__(
        self, pid: int, seconds: int, rate: int = 100, gil: bool = False, native: bool = False
    ) -> None:
        self.seconds, self.rate = seconds, rate
        self._dir = tempfile.TemporaryDirectory(prefix="py-spy-")
        self.out = Path(self._dir.name) / "raw.txt"
        self.proc = subprocess.Popen(
            record_command(pid, seconds, self.out, rate, gil, native),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stacks(self) -> list[Stack]:
        """Wait for the record to end (``seconds`` + 30 s at most) and parse it."""
        try:
            _, err = self.proc.communicate(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        try:
            if self.proc.returncode != 0:  # e.g. --native needs blocking mode (ptrace pauses)
                raise RuntimeError(f"py-spy exited {self.proc.returncode}: {err[-500:]}")
            return parse_raw(self.out.read_text(encoding="utf-8", errors="replace"))
        finally:
            self._dir.cleanup()


def per_thread(stacks: Iterable[Stack]) -> Counter[str]:
    """Samples per thread name."""
    counts: Counter[str] = Counter()
    for stack in stacks:
        counts[stack.thread] += stack.count
    return counts


def function(frame: str) -> str:
    """A frame without its line number: ``Runner.run (asyncio/runners.py)``."""
    return _LINENO.sub(")", frame)


def top(
    stacks: Iterable[Stack],
    thread: str,
    n: int,
    *,
    inclusive: bool = False,
    skip: Callable[[Stack], bool] = lambda _: False,
) -> tuple[list[tuple[str, float]], int]:
    """The ``n`` functions with most of ``thread``'s samples, as (function, share 0-1), and the
    number of samples counted (those of ``thread`` not skipped).

    Self time (``inclusive=False``) charges each sample to its innermost frame; inclusive time
    to every function on its stack (once per sample, however deep the recursion), leaving out
    the threads' entry (``ENTRY_FILES``: gunicorn's arbiter, ``Runner.run``, ``Thread.run``)
    and any function on at least ``ENTRY_SHARE`` of the counted stacks (uvloop's run loop in a
    ``--native`` record), which would otherwise fill the top. A fifth of a ``--nonblocking``
    record's stacks can be torn (their outer frames missing), so "on every stack" misses them.
    """
    mine = [s for s in stacks if s.thread == thread and s.frames and not skip(s)]
    total = sum(s.count for s in mine)
    counts: Counter[str] = Counter()
    for stack in mine:
        names = (
            {function(f) for f in stack.frames if not any(e in f for e in ENTRY_FILES)}
            if inclusive
            else {function(stack.frames[-1])}
        )
        for name in names:
            counts[name] += stack.count
    if inclusive:
        counts = Counter({name: k for name, k in counts.items() if k < ENTRY_SHARE * total})
    return [(name, k / total) for name, k in counts.most_common(n)], total


def idle(stack: Stack) -> bool:
    """A sample of a thread waiting for work: the inference thread on its queue's condition,
    the loop in epoll (``--native`` records keep such samples; plain ones drop them)."""
    inner = stack.frames[-1] if stack.frames else ""
    waiting = any(f.startswith(("Condition.wait (", "WorkQueue.take_new (")) for f in stack.frames)
    return waiting or "epoll" in inner or inner.startswith("uv__io_poll")


def gil_wait(stack: Stack) -> bool:
    """A ``--native`` sample of a thread waiting for the GIL: Python 3.11's ``take_gil`` waits
    on a condition variable (``pthread_cond_timedwait``); its locks and queues wait on
    semaphores instead, so this names the GIL and nothing else that runs here."""
    return any(f.startswith(("pthread_cond_timedwait", "take_gil")) for f in stack.frames)


def in_model_forward(stack: Stack) -> bool:
    """A sample inside the torch module call (the model's forward and everything under it)."""
    return any("torch/nn/modules/module.py" in frame for frame in stack.frames)


def outside_forward(stack: Stack) -> bool:
    """Skip for the inference thread's own work: not in the model's forward, not idle."""
    return in_model_forward(stack) or idle(stack)
