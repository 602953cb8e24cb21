"""py-spy against the server's worker: raw stack samples per thread, and what they add up to.

``py-spy record --format raw --threads`` writes one line per distinct stack,
``thread (<tid>): <name>;<outermost frame>;...;<innermost frame> <count>``, each frame
``function (file:line)``. It runs ``--nonblocking`` (it reads the process's memory without
stopping it, so stacks can now and then be torn, but the server is not slowed by the pauses).

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
    cmd += ["--rate", str(rate), "--duration", str(seconds), "--nonblocking", "-o", str(out)]
    return cmd + (["--gil"] if gil else []) + (["--native"] if native else [])


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
            if self.proc.returncode != 0:
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
    to every function on its stack (once per sample, however deep the recursion).
    """
    counts: Counter[str] = Counter()
    total = 0
    for stack in stacks:
        if stack.thread != thread or skip(stack) or not stack.frames:
            continue
        total += stack.count
        names = {function(f) for f in stack.frames} if inclusive else {function(stack.frames[-1])}
        for name in names:
            counts[name] += stack.count
    return [(name, k / total) for name, k in counts.most_common(n)], total


def in_model_forward(stack: Stack) -> bool:
    """A sample inside the torch module call (the model's forward and everything under it)."""
    return any("torch/nn/modules/module.py" in frame for frame in stack.frames)
