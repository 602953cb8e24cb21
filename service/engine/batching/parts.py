"""An input computed as several parts: a long input's windows (LONG_INPUTS=chunk,
`service.engine.forward.windows`). Inference thread only.

When tokenizing makes an input into parts (`Prepared.parts`), each part becomes an `Item` of
its own in the pool: it is batched, passed over, expired and counted like any input (the
queue depth and the request's occupancy count every part: `WorkQueue.charge`,
`RequestTally.expand`). The input's own future, the one its request awaits, is settled once:
with the `merge` of every part's answer when the last one is answered, or with the first
part's error. A part whose input is already settled (its waiter left, a sibling failed) is
dropped before compute (`Item.dropped`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from functools import partial
from typing import Any

import structlog

from service.engine.batching.queue import Item, WorkQueue
from service.engine.types import Prepared
from service.errors import InferenceFailed

log = structlog.get_logger("service.batcher")


def expand(item: Item, prepared: Prepared, queue: WorkQueue) -> list[Item]:
    """The parts of `item` (whose tokenized form is `prepared`, with `parts`), as items for
    the pool; `item` settles when they do. The queue counts each part from now on."""
    parts = [
        Item(
            unit=part.unit,
            deadline=item.deadline,
            enqueued_at=item.enqueued_at,
            prepared=part,
            tally=item.tally,
            parent=item,
            bulk=item.bulk,
            extra_tokens=item.extra_tokens / len(prepared.parts),
        )
        for part in prepared.parts
    ]
    assert prepared.merge is not None
    gather = _Gather(item, prepared.merge, len(parts))
    for k, part in enumerate(parts):
        part.future.add_done_callback(partial(gather.part_done, k))
    if item.tally is not None:
        item.tally.expand([part.future for part in parts])
    queue.charge(len(parts) - 1, bulk=item.bulk)  # the input was counted; now its parts are
    return parts


class _Gather:
    """Collects the answers of one input's parts, then settles the input's future."""

    def __init__(self, item: Item, merge: Any, n: int) -> None:
        self.item = item
        self.merge = merge
        self.answers: list[Any] = [None] * n
        self.left = n
        self._lock = threading.Lock()  # parts settle in the inference thread; be safe anyway

    def part_done(self, k: int, future: Future[Any]) -> None:
        if future.cancelled():
            return  # dropped because the input is settled already
        error = future.exception()
        if error is not None:
            self.item.fail(error)
            return
        with self._lock:
            self.answers[k] = future.result()
            self.left -= 1
            if self.left:
                return
        try:
            answer = self.merge(self.answers)
        except Exception:
            log.exception("merge_failed", parts=len(self.answers))
            self.item.fail(InferenceFailed("the model failed on this input"))
            return
        if self.item.future.set_running_or_notify_cancel():
            self.item.future.set_result(answer)
