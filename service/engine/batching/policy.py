"""Padding-aware batch selection: which queued inputs run together.

On CPU a batch costs about `overhead + per_token x inputs x longest input`: every input is
padded to the longest one. The inputs waiting (every op and parameter set), sorted by token
count, are split into contiguous runs (at most MAX_BATCH_SIZE inputs and MAX_BATCH_TOKENS padded
tokens each) that minimise the total cost, by dynamic programming over the sorted list (the
optimal 1-D partition, O(inputs x MAX_BATCH_SIZE)). The run with the best efficiency

    real tokens / (overhead_tokens + inputs x longest)

goes first: well-filled runs run now, thin ones wait for company. On an idle server the only
input is the only run, so it starts at once. The pool is re-split before every batch, so the
grouping improves with load rather than in disjoint windows of arrivals.

Starvation is bounded: an input passed over MAX_PASSES times, or whose deadline is near, must
be in the next batch (earliest deadline first, then the oldest), which runs the run holding
it; so an input waits behind at most MAX_PASSES batches plus those forced ahead of it, and FIFO
order holds among inputs in that state.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PASSES = 4


def partition(
    tokens: Sequence[int], *, max_size: int, max_tokens: int | None, overhead_tokens: float
) -> list[tuple[int, int]]:
    """Split `tokens` (sorted ascending) into half-open runs [start, stop) of least total cost.

    cost(run) = overhead_tokens + len(run) x longest; a run holds at most `max_size` inputs and,
    unless it is a single input, at most `max_tokens` padded tokens.
    """
    n = len(tokens)
    cost = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        longest = tokens[stop - 1]
        cap = max_size if max_tokens is None else min(max_size, max(1, max_tokens // longest))
        for start in range(max(0, stop - cap), stop):
            c = cost[start] + overhead_tokens + (stop - start) * longest
            if c < cost[stop]:
                cost[stop], cut[stop] = c, start
    runs, stop = [], n
    while stop > 0:
        runs.append((cut[stop], stop))
        stop = cut[stop]
    return runs[::-1]


def best_run(
    tokens: Sequence[int],
    *,
    must: int | None,
    max_size: int,
    max_tokens: int | None,
    overhead_tokens: float,
) -> tuple[int, int]:
    """The run of `partition(tokens)` to run next: the one holding index `must` (a starving
    or urgent input) if given, else the most efficient one."""
    runs = partition(
        tokens, max_size=max_size, max_tokens=max_tokens, overhead_tokens=overhead_tokens
    )
    if must is not None:
        return next(r for r in runs if r[0] <= must < r[1])

    def efficiency(run: tuple[int, int]) -> float:
        start, stop = run
        real = sum(tokens[start:stop])
        return real / (overhead_tokens + (stop - start) * tokens[stop - 1])

    return max(runs, key=efficiency)
