"""Admission of bulk requests (more inputs than MAX_QUEUE_SIZE): their own room, charged for
their tokens, and interactive requests admitted as if no bulk work waited (the batcher runs
them first: tests/engine/test_selection.py)."""

from __future__ import annotations

import time

import pytest

from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.queue import Item, WorkQueue
from service.engine.jobs import Op, Unit
from service.errors import Overloaded

SHORT = "a short sentence."  # 17 characters


def request(made: list[Item], n: int, text: str = SHORT, deadline_s: float = 60) -> list[Item]:
    deadline = time.monotonic() + deadline_s
    items = [Item(unit=Unit(op=Op.EMBED, text=text), deadline=deadline) for _ in range(n)]
    made += items
    return items


def test_a_full_client_batch_is_admitted_beside_a_full_interactive_queue(
    queued: list[Item],
) -> None:
    queue, estimate = WorkQueue(capacity=8, bulk_capacity=32), ServiceTimeEstimate()
    queue.offer(request(queued, 8), estimate)  # the interactive room is full
    with pytest.raises(Overloaded, match=r"queue full \(8 of 8 inputs waiting\)"):
        queue.offer(request(queued, 1), estimate)
    bulk = request(queued, 32)
    queue.offer(bulk, estimate)
    assert all(i.bulk for i in bulk) and (queue.depth, queue.bulk_depth) == (40, 32)
    with pytest.raises(Overloaded, match=r"queue full \(32 of 32 bulk inputs waiting\)"):
        queue.offer(request(queued, 9), estimate)
    queue.release(bulk[:20])
    assert (queue.depth, queue.bulk_depth) == (20, 12)
    assert queue.room() == 0  # the interactive room is what shed gates and budgets read


def test_the_bulk_room_is_at_least_the_interactive_one() -> None:
    assert WorkQueue(capacity=64, bulk_capacity=16).bulk_capacity == 64
    assert WorkQueue(capacity=256, bulk_capacity=2048).bulk_capacity == 2048


def test_bulk_work_is_charged_its_tokens_and_waits_behind_everything(queued: list[Item]) -> None:
    """A bulk request's predicted wait counts its own tokens (its text at the characters per
    token seen lately), and every input queued; an interactive one's counts neither the bulk
    work nor the bulk inputs."""
    estimate = ServiceTimeEstimate(sec_per_token=1e-3, overhead_tokens=10, tokens_per_input=10)
    estimate.batch_started(100)  # busy: deadlines are checked
    queue = WorkQueue(capacity=4, bulk_capacity=64)
    short = request(queued, 20, deadline_s=2)  # ~6 tokens each at 4 characters a token
    assert estimate.text_tokens([i.unit for i in short]) == pytest.approx(20 * 17 / 4)
    queue.offer(short, estimate)  # 0.11 s running + 3 overheads + 85 tokens: 0.23 s
    long = request(queued, 20, text=SHORT * 40, deadline_s=2)  # 3,400 tokens: 3.5 s
    with pytest.raises(Overloaded, match="predicted wait"):
        queue.offer(long, estimate)
    estimate.observe_text(chars=17 * 40 * 20, tokens=40 * 20)  # the tokenizer says 17 a token
    assert estimate.chars_per_token == pytest.approx(4 + 0.2 * (17 - 4))
    one = request(queued, 1, deadline_s=0.15)  # behind 20 bulk inputs it would wait ~0.35 s
    queue.offer(one, estimate)
    assert not one[0].bulk and queue.depth == 21


def test_a_heavy_request_is_charged_its_tokens_while_it_waits(queued: list[Item]) -> None:
    """A document far longer than the usual input (a late-chunked one) counts its tokens past
    the usual size in every later request's predicted wait until it leaves the queue: a burst
    of long documents is shed at admission, not admitted as one usual input each."""
    estimate = ServiceTimeEstimate(sec_per_token=1e-3, overhead_tokens=10, tokens_per_input=10)
    estimate.batch_started(100)  # busy for 0.11 s: deadlines are checked
    queue = WorkQueue(capacity=64, bulk_capacity=64)
    document = request(queued, 1, text=SHORT * 100)  # 1,700 characters: 425 tokens
    queue.offer(document, estimate)
    assert document[0].extra_tokens == pytest.approx(17 * 100 / 4 - 10)
    # 0.11 s running, then one batch: 10 overhead + 2 usual inputs + 415 more tokens: 0.555 s
    with pytest.raises(Overloaded, match="predicted wait"):
        queue.offer(request(queued, 1, deadline_s=0.3), estimate)
    usual = request(queued, 1)  # a usual input carries nothing past its size
    queue.offer(usual, estimate)
    assert usual[0].extra_tokens == 0.0
    queue.release(document + usual)
    queue.offer(request(queued, 1, deadline_s=0.3), estimate)  # 0.11 + 0.02 s: admitted
