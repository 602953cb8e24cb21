"""Bulk inputs that wait untokenized, so that tokenizing an indexer's request never stalls the
inference thread for long. Inference thread only.

Tokenizing a 1,000-input request in one call takes the inference thread tens of ms (as long as
a dozen one-input batches), and every interactive input that arrives meanwhile waits for it.
So a bulk request's inputs enter the backlog, and the pool (`service.engine.batching.forming`)
takes them from it in arrival order, at most one batch's worth (MAX_BATCH_SIZE) a step, while
it holds fewer than the bulk candidates the batcher chooses among
(`policy.BULK_WINDOW x MAX_BATCH_SIZE`). They stay counted in the queue's depth until they run
or are dropped, as inputs in the pool are.
"""

from __future__ import annotations

from collections import deque

from service.engine.batching.queue import Item


class Backlog:
    """Bulk inputs handed over by the queue, not yet tokenized, in arrival order."""

    def __init__(self) -> None:
        self._items: deque[Item] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, items: list[Item]) -> list[Item]:
        """Keep the bulk ones of `items`; the others, to tokenize now."""
        self._items.extend(i for i in items if i.bulk)
        return [i for i in items if not i.bulk]

    def next(self, pooled: int, window: int, step: int) -> list[Item]:
        """The oldest held inputs to tokenize now: up to `step` of them, and no more than the
        pool's `pooled` bulk inputs lack of `window`."""
        n = min(step, window - pooled, len(self._items))
        return [self._items.popleft() for _ in range(max(0, n))]

    def drain(self) -> list[Item]:
        """Every held input (to answer with an error: drain, shutdown, a failed load)."""
        out = list(self._items)
        self._items.clear()
        return out
