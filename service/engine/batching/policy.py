"""Batch selection: which queued inputs run together, and what a batch costs.

How a batch is computed decides both (`ModelInfo.compute`, `service.backends.packed`):

- **padded**: a batch costs about `overhead + per_token x inputs x longest input`: every input
  is padded to the longest one. The waiting inputs (every op and parameter set), sorted by
  token count, are split into contiguous runs (at most MAX_BATCH_SIZE inputs and
  MAX_BATCH_TOKENS padded tokens each) that minimise the total cost, by dynamic programming
  over the sorted list (the optimal 1-D partition, O(inputs x MAX_BATCH_SIZE)). The run with
  the best efficiency

      real tokens / (overhead_tokens + inputs x longest)

  goes first: well-filled runs run now, thin ones wait for company. On an idle server the only
  input is the only run, so it starts at once. The pool is re-split before every batch, so the
  grouping improves with load rather than in disjoint windows of arrivals.
- **packed**: a batch costs about `overhead + per_token x real tokens` (the token-wise parts
  run on the concatenated real tokens), so lengths need not match for the matrix products.
  Attention still runs per group of similar lengths (`service.backends.packing`), one call a
  group, so a batch of similar lengths makes fewer calls: the batch is the oldest input and,
  among the oldest PACKED_WINDOW x MAX_BATCH_SIZE inputs, those nearest to it in length, at
  most MAX_BATCH_SIZE of them and MAX_BATCH_TOKENS real tokens (TEI's `max-batch-tokens`).
  With no more than MAX_BATCH_SIZE waiting that is all of them, in arrival order: at the
  default 64, 128 closed-loop clients find 64 waiting whenever a batch ends. With more
  waiting the batches come out closer to length-sorted, at a cost to the tail: an input can
  be passed over (docs/backends.md measures the p99 it costs). The window bounds that cost.

Either way a single input always runs, whatever its length. Starvation is bounded: an input
passed over MAX_PASSES times, or whose deadline is near, must be in the next batch (earliest
deadline first, then the oldest), which runs the run holding it (padded) or is the one the
others are chosen near (packed); so an input waits behind at most MAX_PASSES batches plus
those forced ahead of it, and FIFO order holds among inputs in that state. Packed, a batch
that no forced input anchors holds the oldest input: an input waits for at most as many
batches as there are inputs older than it, besides the forced ones.

Bulk requests (more inputs than MAX_QUEUE_SIZE: `service.engine.batching.queue`) yield to
interactive ones (`next_must`): while bulk inputs wait, the oldest interactive input must be in
the next batch (a forced interactive input first), so a one-input request waits for the running
batch, not for the 2,048 inputs queued before it; the batch holding it is filled with bulk
inputs. Only the first BULK_WINDOW batches' worth of bulk inputs (in arrival order) are
candidates: choosing among them stays cheap.

A batch cannot be interrupted, so an interactive input arriving while a full batch of bulk
inputs runs would wait for all of it, then run beside more of them. So while interactive
traffic is recent (an interactive input arrived within INTERACTIVE_RECENT_S), a batch holds
either the interactive inputs waiting and no bulk input, or, when none waits, a slice of bulk
inputs (`bulk_slice`): the oldest ones whose computed tokens fit a budget that takes about
BULK_SLICE_MS by the batch cost model (`bulk_slice_tokens`), and never less than one input. An
interactive arrival then waits for at most one slice, and its batch runs as fast as without
bulk work. Without recent interactive traffic a bulk batch is bounded too, at IDLE_SLICES
slices (100 ms by default, a small share of bulk throughput by the cost model): the first
interactive input after a lull waits for at most that, not for a full batch of long bulk
inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

MAX_PASSES = 4
BULK_WINDOW = 4  # bulk candidates: this many batches' worth (MAX_BATCH_SIZE each)
INTERACTIVE_RECENT_S = 1.0  # interactive traffic is recent: one arrived within this long
IDLE_SLICES = 10  # a bulk batch's bound without recent interactive traffic, in slices
PACKED_WINDOW = 2  # a packed batch is chosen among this many batches' worth of the oldest


class Waiting(Protocol):
    """What the rule reads of a queued input (`service.engine.batching.queue.Item`)."""

    @property
    def bulk(self) -> bool: ...
    @property
    def tokens(self) -> int: ...
    @property
    def enqueued_at(self) -> float: ...
    @property
    def deadline(self) -> float: ...
    @property
    def passed_over(self) -> int: ...


W = TypeVar("W", bound=Waiting)


def next_must(
    pool: Sequence[W],
    *,
    now: float,
    urgent_s: float,
    max_size: int,
    bulk_tokens: int | None = None,
    packed: bool = True,
) -> tuple[list[W], W | None]:
    """The candidates for the next batch (every interactive input, the first
    `BULK_WINDOW x max_size` bulk ones in `pool`'s order; with `bulk_tokens`, the interactive
    inputs alone, or when there are none the slice of bulk ones that fits `bulk_tokens`
    computed tokens: `bulk_slice`) and the input it must hold, or None:
    a forced interactive input (passed over MAX_PASSES times, or due within `urgent_s` of
    `now`; the earliest deadline, then the oldest), else while bulk inputs wait the oldest
    interactive input, else a forced bulk input among the candidates."""
    interactive = [i for i in pool if not i.bulk]
    bulk = [i for i in pool if i.bulk][: BULK_WINDOW * max_size]
    if bulk_tokens is not None:
        bulk = [] if interactive else bulk_slice(bulk, bulk_tokens, packed=packed)

    def forced(items: list[W]) -> W | None:
        due = [i for i in items if i.passed_over >= MAX_PASSES or i.deadline - now < urgent_s]
        return min(due, key=lambda i: (i.deadline, i.enqueued_at)) if due else None

    must = forced(interactive)
    if must is None and interactive and bulk:
        must = min(interactive, key=lambda i: i.enqueued_at)
    if must is None:
        must = forced(bulk)
    return interactive + bulk, must


def bulk_slice_tokens(*, slice_s: float, sec_per_token: float, overhead_tokens: float) -> int:
    """The computed tokens of a bulk slice: those a batch computes in `slice_s` seconds besides
    its fixed cost, by the batch cost model `sec_per_token x (overhead_tokens + tokens)`
    (`service.engine.batching.cost`); 0 when the fixed cost alone takes longer (a slice is
    then one input: `bulk_slice`). No floor from the overhead: calibrated on a busy machine it
    can reach thousands of tokens, and the slice with it."""
    fits = slice_s / max(sec_per_token, 1e-12) - overhead_tokens
    return max(0, round(fits))


def bulk_slice(bulk: Sequence[W], budget: int, *, packed: bool) -> list[W]:
    """The longest prefix of `bulk` (in its order) whose computed tokens (`computed_tokens`:
    their sum when `packed`, else their number x the longest) are at most `budget`; at least
    the first input, whatever its length."""
    out: list[W] = []
    total = longest = 0
    for item in bulk:
        total, longest = total + item.tokens, max(longest, item.tokens)
        if out and (total if packed else (len(out) + 1) * longest) > budget:
            break
        out.append(item)
    return out


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


def computed_tokens(tokens: Sequence[int], *, packed: bool) -> int:
    """The tokens a batch of inputs `tokens` tokens long computes: their sum when packed,
    inputs x the longest when padded (0 for no inputs). The unit of the batch cost model
    (`service.engine.batching.cost`) and of MAX_BATCH_TOKENS."""
    if not tokens:
        return 0
    return sum(tokens) if packed else len(tokens) * max(tokens)


def nearest_run(
    tokens: Sequence[int], *, must: int | None, max_size: int, max_tokens: int | None
) -> list[int]:
    """The next packed batch from inputs `tokens` long, in arrival order: indices of the
    anchor (`must` if given, else the oldest, index 0) then, of the oldest
    `PACKED_WINDOW x max_size` inputs, the others in order of their distance in tokens to the
    anchor's length (the older first on a tie), each taken while the batch holds fewer than
    `max_size` inputs and it fits `max_tokens` real tokens with it (one that does not is
    passed over, a shorter one may still fit). The anchor always runs, whatever its length.
    O(n log n) in the window."""
    if not tokens:
        return []
    anchor = 0 if must is None else must
    length = tokens[anchor]
    window = min(len(tokens), PACKED_WINDOW * max_size)
    others = sorted(
        (i for i in range(window) if i != anchor),
        key=lambda i: (abs(tokens[i] - length), i),
    )
    picked, total = [anchor], length
    for i in others:
        if len(picked) >= max_size:
            break
        if max_tokens is not None and total + tokens[i] > max_tokens:
            continue
        picked.append(i)
        total += tokens[i]
    return picked


def next_batch(
    tokens: Sequence[int],
    *,
    must: int | None,
    max_size: int,
    max_tokens: int | None,
    overhead_tokens: float,
    packed: bool,
) -> list[int]:
    """Indices into `tokens` (the waiting inputs' lengths, in arrival order) of the batch to
    run next, as the module says for a `packed` or padded forward; `must`: the index of an
    input that must be in it (starving or urgent), or None."""
    if packed:
        return nearest_run(tokens, must=must, max_size=max_size, max_tokens=max_tokens)
    order = sorted(range(len(tokens)), key=lambda i: tokens[i])
    start, stop = best_run(
        [tokens[i] for i in order],
        must=order.index(must) if must is not None else None,
        max_size=max_size,
        max_tokens=max_tokens,
        overhead_tokens=overhead_tokens,
    )
    return order[start:stop]
