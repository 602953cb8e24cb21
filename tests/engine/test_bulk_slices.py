"""While interactive traffic is recent, a batch's bulk inputs are a slice (`policy.bulk_slice`),
and bulk inputs are tokenized a batch's worth at a time (`backlog`): the batcher itself
(`BatchFormer`), its clock frozen, on 1,000 bulk inputs and one interactive input at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.forming import BatchFormer
from service.engine.batching.policy import INTERACTIVE_RECENT_S
from service.engine.batching.queue import Item, WorkQueue
from service.engine.batching.running import LastBatch
from service.engine.jobs import Op, Unit
from service.engine.types import Prepared
from service.settings import Settings


class LengthEngine:
    """Tokenizes nothing: a unit of text "n ..." is an n-token input (the pool without a model);
    `calls` holds the inputs each `prepare_many` call got."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        self.calls.append(len(units))
        return [Prepared(unit=u, n_tokens=int(str(u.text).split()[0])) for u in units]


class Clock:
    """`time.monotonic` for the batcher, moved by hand (starts at the real clock's reading)."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    frozen = Clock()
    monkeypatch.setattr("service.engine.batching.forming.time.monotonic", frozen)
    return frozen


def pool(
    packed: bool, slice_ms: float = 10.0, sec_per_token: float = 1e-5
) -> tuple[BatchFormer, Any]:
    """A batcher whose batches cost `sec_per_token` a token plus 50 tokens: at 10 us a token a
    10 ms slice is 950 tokens, 10 slices (no interactive traffic) 9,950."""
    estimate = ServiceTimeEstimate(
        max_batch_size=32, overhead_tokens=50.0, sec_per_token=sec_per_token
    )
    settings = Settings(max_batch_size=32, max_queue_size=64, bulk_slice_ms=slice_ms)
    former = BatchFormer(settings, WorkQueue(64, 2048), estimate)
    former.packed = packed
    return former, LengthEngine()


def offer(former: BatchFormer, texts: list[str], made: list[Item]) -> list[Item]:
    """One request of `texts`, queued (bulk when more than 64)."""
    items = [Item(unit=Unit(op=Op.EMBED, text=t), deadline=time.monotonic() + 600) for t in texts]
    made += items
    former.queue.offer(items, former.estimate)
    return items


def batch(former: BatchFormer, engine: Any) -> list[Item]:
    former.admit(engine, former.queue.take_new(0))
    return former.next_batch(engine, LastBatch())


def test_bulk_runs_in_slices_while_interactive_traffic_is_recent(
    clock: Clock, queued: list[Item]
) -> None:
    former, engine = pool(packed=True)
    bulk = offer(former, ["100 passage"] * 1000, queued)
    assert all(i.bulk for i in bulk)
    assert batch(former, engine) == bulk[:32]  # no interactive traffic: full batches
    one = offer(former, ["40 query"], queued)
    assert batch(former, engine) == one  # the interactive input runs without bulk inputs
    assert batch(former, engine) == bulk[32:41]  # then bulk slices: 9 x 100 tokens fit 950
    clock.now += INTERACTIVE_RECENT_S / 2
    two = offer(former, ["40 query", "12 another"], queued)
    assert batch(former, engine) == two
    assert batch(former, engine) == bulk[41:50]
    clock.now += INTERACTIVE_RECENT_S + 0.01
    assert batch(former, engine) == bulk[50:82]  # quiet for a while: full batches again


def test_without_interactive_traffic_a_bulk_batch_takes_at_most_ten_slices(
    clock: Clock, queued: list[Item]
) -> None:
    """At 100 us a token: 10 slices (100 ms) are 950 tokens, 9 inputs of 100, where a full batch
    (32) would take 330 ms; once an interactive input came, slices of 50 tokens: one input."""
    former, engine = pool(packed=True, sec_per_token=1e-4)
    bulk = offer(former, ["100 passage"] * 1000, queued)
    assert batch(former, engine) == bulk[:9]
    one = offer(former, ["40 query"], queued)
    assert batch(former, engine) == one
    assert batch(former, engine) == [bulk[9]]
    clock.now += INTERACTIVE_RECENT_S
    assert batch(former, engine) == bulk[10:19]


def test_bulk_slice_ms_0_keeps_bulk_batches_full(clock: Clock, queued: list[Item]) -> None:
    assert Settings().bulk_slice_ms == 10.0
    former, engine = pool(packed=True, slice_ms=0)
    bulk = offer(former, ["100 passage"] * 1000, queued)
    batch(former, engine)
    one = offer(former, ["40 query"], queued)
    assert batch(former, engine) == [*bulk[32:63], *one]  # the oldest interactive, 31 bulk


def test_padded_slices_count_their_padding(clock: Clock, queued: list[Item]) -> None:
    """Padded: a slice computes its number of inputs x the longest, so one long bulk input
    shortens it."""
    former, engine = pool(packed=False)
    bulk = offer(former, ["50 a"] * 4 + ["400 long"] + ["50 b"] * 995, queued)
    one = offer(former, ["60 query"], queued)
    assert batch(former, engine) == one
    assert batch(former, engine) == bulk[:4]  # 5 x 400 = 2,000 > 950: it ends before the long
    assert batch(former, engine) == [bulk[4]]  # the long one alone: 400 tokens
    assert batch(former, engine) == bulk[5:24]  # 19 x 50 = 950


def test_bulk_inputs_are_tokenized_a_batchs_worth_a_step_up_to_the_window(
    clock: Clock, queued: list[Item]
) -> None:
    """1,000 bulk inputs: each step tokenizes at most 32 of them (with whatever interactive
    input arrived) while the pool holds fewer than 4 x 32; inputs whose request left are
    dropped untokenized; a shutdown answers the backlog too."""
    former, engine = pool(packed=True)
    bulk = offer(former, ["100 passage"] * 1000, queued)
    former.admit(engine, former.queue.take_new(0))
    assert engine.calls == [32] and len(former.pool) == 32 and len(former.backlog) == 968
    offer(former, ["40 query"], queued)
    former.admit(engine, former.queue.take_new(0))
    assert engine.calls[-1] == 33  # the query, and the next 32
    for _ in range(3):
        former.admit(engine, [])
    assert engine.calls == [32, 33, 32, 32]  # the third: the pool holds 4 x 32 already
    assert sum(1 for i in former.pool if i.bulk) == 128 and len(former.backlog) == 872
    assert former.queue.depth == 1001 and former.queue.bulk_depth == 1000
    former.take(former.pool[:32])  # a batch of the first 32
    for item in bulk[128:192]:
        item.future.cancel()  # the client left: what is held is dropped, never tokenized
    former.admit(engine, [])
    former.admit(engine, [])
    assert engine.calls == [32, 33, 32, 32] and former.queue.bulk_depth == 1000 - 32 - 64
    former.admit(engine, [])
    assert engine.calls[-1] == 32 and former.pool[-1] is bulk[223]
    former.fail_all(lambda: RuntimeError("shutting down"))
    assert former.queue.depth == 0 and not former.waiting
    assert isinstance(bulk[-1].future.exception(0), RuntimeError)
