"""How many intra-op threads a small batch runs on: one, where it costs less CPU and about no
more time, chosen by measurement at start (torch, and onnxruntime's second session).

A lone short input costs mostly the fixed price of running each operator once; split over two
threads, each of a small forward's dozens of operators wakes the second thread and waits for
it, which costs about as much CPU as it saves in time (docs/backends.md, small batches on
one thread). A batch of at most `one_thread_up_to` padded tokens (B x L) runs on one thread
(torch: `torch.set_num_threads(1)`; onnxruntime: a second session made with one,
`service.backends.onnx_backend`), so it wakes no other thread; larger ones on every thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

# Time a batch may take longer on one thread and still run there: half of the one-client
# goal's 2 ms over the call.
SLOWER_BY_AT_MOST_S = 0.001
ROUNDS = 3


class ThreadFitted(Protocol):
    """What `fit_one_thread` measures and sets: a `TorchBackend` or an `OnnxBackend`."""

    one_thread_up_to: int

    def all_threads(self) -> int:
        """The intra-op threads a batch runs on when it is not on one."""
        ...

    def forward_on(self, inputs: Mapping[str, torch.Tensor], threads: int) -> torch.Tensor:
        """`forward` on `threads` intra-op threads (1, or `all_threads()`)."""
        ...

    def release_one_thread(self) -> None:
        """Free what running on one thread holds, once no batch will."""
        ...


@contextlib.contextmanager
def threads_set(n: int) -> Iterator[None]:
    """torch's intra-op threads at `n` within the block, then as they were. oneDNN keys its
    kernels by thread count too: a shape run on one thread compiles its own."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _timed(
    backend: ThreadFitted, inputs: Mapping[str, torch.Tensor], threads: int
) -> tuple[float, float]:
    """Seconds and process CPU-seconds of one forward on `threads` intra-op threads."""
    started, cpu = time.perf_counter(), time.process_time()
    backend.forward_on(inputs, threads)
    return time.perf_counter() - started, time.process_time() - cpu


def fit_one_thread(
    backend: ThreadFitted, batches: Sequence[Mapping[str, torch.Tensor]]
) -> dict[str, object]:
    """Set `backend.one_thread_up_to` from `batches` (padded inputs, smallest first): the
    padded tokens of the largest batch, counted from the smallest while each passes, on which
    one thread costs less CPU than all of them and at most `SLOWER_BY_AT_MOST_S` more time
    (best of `ROUNDS`, alternated). Returns what it measured, for the log; leaves it 0 where
    the backend runs one thread anyway. Where it stays 0, `release_one_thread`."""
    threads = backend.all_threads()
    backend.one_thread_up_to = 0
    if threads <= 1:
        return {"threads": threads}
    measured = []
    for inputs in batches:
        tokens = int(inputs["input_ids"].numel())
        _timed(backend, inputs, 1)  # untimed: first shapes
        _timed(backend, inputs, threads)
        one = [_timed(backend, inputs, 1) for _ in range(ROUNDS)]
        all_ = [_timed(backend, inputs, threads) for _ in range(ROUNDS)]
        wall1, cpu1 = min(w for w, _ in one), min(c for _, c in one)
        wall_n, cpu_n = min(w for w, _ in all_), min(c for _, c in all_)
        passes = cpu1 < cpu_n and wall1 <= wall_n + SLOWER_BY_AT_MOST_S
        measured.append(
            {
                "padded_tokens": tokens,
                "one_thread_ms": round(1000 * wall1, 2),
                "one_thread_cpu_ms": round(1000 * cpu1, 2),
                f"{threads}_threads_ms": round(1000 * wall_n, 2),
                f"{threads}_threads_cpu_ms": round(1000 * cpu_n, 2),
            }
        )
        if not passes:
            break
        backend.one_thread_up_to = tokens
    if not backend.one_thread_up_to:
        backend.release_one_thread()
    return {"threads": threads, "one_thread_up_to": backend.one_thread_up_to, "batches": measured}
