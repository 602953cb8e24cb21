"""The shed budget: sheds may take a bounded share of the loop's CPU; past it, a
connection that resends without waiting is not read until the budget allows, then its request
is decided again. A first request, a polite one, a pooled connection at moderate overload and
the probes are answered at once.

In-process server (uvicorn with the HTTP edge, a tiny classifier) whose batches are held by a
gate, so the queue stays full as long as a test needs; raw keep-alive connections on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from inprocess import Recorder, Served, http_post, raw_request, read_answer, sample, serve

from service.admission import budget
from service.admission.budget import ShedBudget
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.queue import Item, WorkQueue
from service.engine.jobs import Op, Unit
from service.settings import Settings

QUEUE = 4
HOLD_S = 1.5  # the most a held request waits in these tests (`_MAX_HOLD_S`, patched)
# An answer not held comes well before a hold ends: under half of it, a margin for a busy CI.
AT_ONCE = HOLD_S / 2

Full = Callable[..., AbstractContextManager[tuple[Served, Recorder]]]
Answer = tuple[int, float]  # status, seconds to the answer


@pytest.fixture
def full(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Full:
    """`with full(burst_s=..., **settings) as (served, recorder)`: a server whose batches are
    held and whose queue `_fill` fills; the budget's burst and longest hold patched small."""

    @contextmanager
    def make(burst_s: float = 0.0, **kw: Any) -> Iterator[tuple[Served, Recorder]]:
        monkeypatch.setattr(budget, "_BURST_S", burst_s)
        monkeypatch.setattr(budget, "_MAX_HOLD_S", HOLD_S)
        settings = Settings(
            model_id=str(tiny_models["text-classification"]),
            torch_num_threads=1,
            max_batch_size=1,
            max_queue_size=QUEUE,
            max_client_batch_size=QUEUE,
            shed_tarpit=False,  # the budget alone decides what is held here
            **kw,
        )
        recorder = Recorder()
        with serve(settings, recorder) as served:
            recorder.gate.clear()
            yield served, recorder
            recorder.gate.set()

    return make


async def _fill(url: str) -> list[asyncio.Task[Any]]:
    """One request whose batch is held, and QUEUE inputs queued behind it (keep the tasks)."""
    held = asyncio.create_task(_exchange(url, http_post("held")))
    await asyncio.sleep(0.3)
    body = json.dumps({"inputs": [f"queued {i}" for i in range(QUEUE)]})
    queued = asyncio.create_task(_exchange(url, http_post(body, "application/json")))
    await asyncio.sleep(0.3)
    return [held, queued]


async def _exchange(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await raw_request(url, request)
    try:
        return await read_answer(reader)
    finally:
        writer.close()


async def _timed(reader: asyncio.StreamReader) -> Answer:
    started = time.monotonic()
    status, _, _ = await read_answer(reader)
    return status, time.monotonic() - started


async def _storm_connection(url: str, texts: list[str], wait_s: float = 0.0) -> list[Answer]:
    """Requests on one keep-alive connection, each sent `wait_s` after the last answer (0: at
    once, as a storm client or a busy proxy's pooled connection), differing bodies."""
    reader, writer = await raw_request(url, http_post(texts[0]))
    answers = [await _timed(reader)]
    for text in texts[1:]:
        await asyncio.sleep(wait_s)
        writer.write(http_post(text))
        await writer.drain()
        answers.append(await _timed(reader))
    writer.close()
    return answers


def _probe(url: str) -> dict[str, float]:
    """Seconds each probe took (all must answer 200)."""
    took = {}
    for path in ("/livez", "/readyz", "/metrics"):
        started = time.monotonic()
        assert httpx.get(url + path, timeout=5).status_code == 200, path
        took[path] = time.monotonic() - started
    return took


def test_a_spent_budget_holds_an_impatient_connection_then_reads_it_again(full: Full) -> None:
    """Budget spent by the first shed (no burst): the connection's next request, sent at once,
    is not answered while held (its connection not read, `reads_paused` 1), and is shed when
    its hold ends; the connection is read again, and its next request, still impatient, is
    held twice as long. A request after a polite wait (Retry-After, 1 s) is answered at once.
    Meanwhile a fresh connection's first request and the probes are answered at once."""

    async def scenario(url: str) -> tuple[list[Answer], Answer, dict[str, float], float]:
        _filled = await _fill(url)
        storm = asyncio.create_task(_storm_connection(url, ["one", "another", "a third"]))
        await asyncio.sleep(0.2)  # the second request is held now
        paused = await asyncio.to_thread(sample, "pipeline_server_reads_paused")
        probes = await asyncio.to_thread(_probe, url)
        started = time.monotonic()
        fresh, _, _ = await _exchange(url, http_post("a polite client's first"))
        fresh_answer = (fresh, time.monotonic() - started)
        first_two = await storm
        polite = await _storm_connection(url, ["x", "yy"], wait_s=1.05)
        return [*first_two, *polite], fresh_answer, probes, paused

    with full(shed_budget_share=0.001) as (served, recorder):
        held_before = sample("pipeline_server_shed_held_total", outcome="shed")
        cpu_before = sample("pipeline_server_shed_cpu_seconds_total")
        answers, fresh, probes, paused = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        (s1, t1), (s2, t2), (s3, t3), (s4, t4), (s5, t5) = answers
        assert s1 == 503 and t1 < AT_ONCE  # a first request: at once
        assert s2 == 503 and HOLD_S - 0.1 < t2 < HOLD_S + 1.0, t2  # held, then shed
        assert s3 == 503 and 2 * HOLD_S - 0.1 < t3 < 2 * HOLD_S + 1.0, t3  # held twice as long
        assert paused == 1
        assert fresh[0] == 503 and fresh[1] < AT_ONCE, fresh  # another client: at once
        assert all(t < AT_ONCE for t in probes.values()), probes
        assert (s4, s5) == (503, 503) and t4 < AT_ONCE and t5 < AT_ONCE  # polite: never held
        assert sample("pipeline_server_shed_held_total", outcome="shed") - held_before == 2
        assert sample("pipeline_server_shed_cpu_seconds_total") > cpu_before
        assert sample("pipeline_server_reads_paused") == 0
        assert not {"one", "another", "a third"} & set(recorder.ran)


def test_a_connection_shed_after_each_hold_is_held_longer_until_it_waits(
    full: Full, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One connection resending at once, the budget spent: its held requests end shed, each
    hold twice the last, at most four times the first (`longest_hold`); after one polite wait
    its request is answered at once and the next impatient one is held the first hold again."""
    hold = 0.4
    waits = [0.0, 0.0, 0.0, 0.0, 0.0, 1.05, 0.0]  # before each request after the first

    async def scenario(url: str) -> list[Answer]:
        _filled = await _fill(url)
        reader, writer = await raw_request(url, http_post("request 0"))
        answers = [await _timed(reader)]
        for i, wait_s in enumerate(waits, 1):
            await asyncio.sleep(wait_s)
            writer.write(http_post(f"request {i}"))
            await writer.drain()
            answers.append(await _timed(reader))
        writer.close()
        return answers

    with full(shed_budget_share=0.001) as (served, _):
        monkeypatch.setattr(budget, "_MAX_HOLD_S", hold)
        answers = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
    assert {s for s, _ in answers} == {503}, answers
    took = [t for _, t in answers]
    expected = [0, 1, 2, 4, 4, 4, 0, 1]  # in holds: first request; held; ...; polite; held
    for t, times in zip(took, expected, strict=True):
        if times == 0:
            assert t < hold / 2, took
        else:
            assert times * hold - 0.1 < t < times * hold + 0.3, took


def test_the_longest_hold_doubles_twice() -> None:
    assert [budget.longest_hold(n) for n in (0, 1, 2, 3, 10)] == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_held_request_is_admitted_when_room_frees_meanwhile(full: Full) -> None:
    """Released, a held request is decided again with the deadline it has left: the model ran
    meanwhile, so it is admitted and answered 200 on its connection."""

    async def scenario(url: str, recorder: Recorder) -> list[Answer]:
        _filled = await _fill(url)
        storm = asyncio.create_task(_storm_connection(url, ["first", "second"]))
        await asyncio.sleep(0.2)  # "second" is held now
        recorder.gate.set()  # the model runs again: the queue drains
        return await storm

    with full(shed_budget_share=0.001) as (served, recorder):
        before = sample("pipeline_server_shed_held_total", outcome="admitted")
        first, second = asyncio.run(asyncio.wait_for(scenario(served.url, recorder), 30))
        assert first[0] == 503 and second[0] == 200
        assert "second" in recorder.ran
        assert sample("pipeline_server_shed_held_total", outcome="admitted") - before == 1


def test_a_pooled_connection_at_moderate_overload_is_never_held(full: Full) -> None:
    """A proxy's pooled connection sends its clients' requests back to back (never waiting
    for Retry-After): 30 sheds at about 50 a second cost far less than the default share, so
    each is answered at once and nothing is held."""

    async def scenario(url: str) -> list[Answer]:
        _filled = await _fill(url)
        return await _storm_connection(url, [f"client {i}" * (1 + i % 3) for i in range(30)], 0.02)

    with full(burst_s=0.02) as (served, _):  # the default share and burst
        before = sum(
            sample("pipeline_server_shed_held_total", outcome=o) for o in ("shed", "admitted")
        )
        answers = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert {s for s, _ in answers} == {503}
        assert max(t for _, t in answers) < AT_ONCE, answers
        after = sum(
            sample("pipeline_server_shed_held_total", outcome=o) for o in ("shed", "admitted")
        )
        assert after == before


def test_a_draining_server_holds_nothing(full: Full) -> None:
    """After SIGTERM a request on an open connection gets its 503 at once (DESIGN: Shutdown),
    even from an impatient connection while the budget is spent: a hold could outlast the
    process."""

    async def scenario(url: str, served: Served) -> list[Answer]:
        _filled = await _fill(url)
        served.begin_drain()
        await asyncio.sleep(0.1)
        return await _storm_connection(url, ["one", "two", "three"])

    with full(shed_budget_share=0.001) as (served, _):
        answers = asyncio.run(asyncio.wait_for(scenario(served.url, served), 30))
        assert [s for s, _ in answers] == [503] * 3 and max(t for _, t in answers) < AT_ONCE
        assert sample("pipeline_server_reads_paused") == 0


def test_the_budget_off_holds_nothing(full: Full) -> None:
    async def scenario(url: str) -> list[Answer]:
        _filled = await _fill(url)
        return await _storm_connection(url, ["one", "two", "three"])

    with full(shed_budget_share=0) as (served, _):
        answers = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert [s for s, _ in answers] == [503] * 3 and max(t for _, t in answers) < AT_ONCE


def test_the_bucket_refills_at_its_share() -> None:
    """Without HTTP: spent by a charge past the burst (debt capped at one burst), the bucket
    is exhausted until it has refilled at `share` seconds per second."""

    async def scenario() -> tuple[bool, float]:
        budget = ShedBudget(share=0.1, room=lambda deadline: 0, burst_s=0.001)
        budget.charge(0.05)  # charged at most 2 ms; debt is capped at one burst: -1 ms
        spent = budget.exhausted()
        started = time.monotonic()
        while budget.exhausted():
            await asyncio.sleep(0.001)
        return spent, time.monotonic() - started

    spent, took = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert spent
    assert 0.009 < took < 0.5  # the debt (1 ms at 0.1 s/s) had to refill first


def test_with_room_held_requests_wait_for_room_not_for_the_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without HTTP: with `room`, a refilled bucket releases nothing while the queue has no
    room (each release would only be shed); room for two releases the two oldest, in order;
    the last goes when its hold ends, room or not. `room` is asked with the oldest held
    request's deadline."""
    monkeypatch.setattr(budget, "_MAX_HOLD_S", 0.4)
    room = [0]
    asked: list[float] = []
    due = [time.monotonic() + 5 + i for i in range(3)]

    def take(deadline: float) -> int:
        asked.append(deadline)
        free, room[0] = room[0], 0
        return free

    async def scenario() -> tuple[list[int], list[int], list[int], float]:
        budget = ShedBudget(share=0.1, room=take, burst_s=0.001)
        budget.charge(0.05)
        released: list[int] = []
        started = time.monotonic()
        for i in range(3):
            budget.hold(lambda i=i: released.append(i), due[i])
        await asyncio.sleep(0.1)  # the debt (1 ms) refilled after 10 ms
        while_full = list(released)
        room[0] = 2
        await asyncio.sleep(0.05)
        with_room = list(released)
        while len(released) < 3:
            await asyncio.sleep(0.005)
        return while_full, with_room, released, time.monotonic() - started

    while_full, with_room, released, took = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert while_full == [] and with_room == [0, 1] and released == [0, 1, 2]
    assert 0.38 < took < 1.0  # the third waited out its 0.4 s hold
    assert asked[0] == due[0] and asked[-1] == due[2]  # the oldest's, then the last one's


def test_the_queue_counts_room_in_requests_of_the_usual_size() -> None:
    """`WorkQueue.room`: free inputs over the moving mean of admitted requests' inputs."""
    queue, estimate = WorkQueue(capacity=10), ServiceTimeEstimate()
    deadline = time.monotonic() + 60

    def request(n: int) -> list[Item]:
        return [Item(unit=Unit(op=Op.EMBED, text="x"), deadline=deadline) for _ in range(n)]

    assert queue.room() == 10  # nothing admitted yet: one input a request
    items: list[Item] = []
    for _ in range(40):  # two-input requests, each taken at once
        items += (offered := request(2))
        queue.offer(offered, estimate)
        queue.take_new(0)
        queue.release(offered)
    items += (last := request(2))
    queue.offer(last, estimate)
    try:
        assert queue.depth == 2
        assert queue.room() == 4  # 8 free inputs, about 2 inputs a request by now
    finally:
        for item in items:  # settle the occupancy gauges
            item.future.set_result(None)


def test_a_queue_with_places_a_deadline_cannot_use_has_no_room() -> None:
    """`WorkQueue.room_by`: free places count as room only while a usual request due by the
    deadline would be admitted; a slow model (a predicted wait past it) leaves none, so held
    requests are not released into a shed for their deadline (released, shed, resent and held
    again, over and over)."""
    queue = WorkQueue(capacity=10)
    fast = ServiceTimeEstimate(sec_per_token=1e-6, tokens_per_input=10.0)
    slow = ServiceTimeEstimate(sec_per_token=1e-2, tokens_per_input=10.0)  # ~0.1 s an input
    now = time.monotonic()
    items = [Item(unit=Unit(op=Op.EMBED, text="x"), deadline=now + 60) for _ in range(4)]
    for item in items:  # four one-input requests
        queue.offer([item], fast)
    try:
        assert queue.room() == 6
        assert queue.room_by(now + 2, fast) == 6
        # 4 inputs ahead, one's own and a batch's overhead (64 tokens) at 0.01 s a token: 1.14 s
        assert queue.room_by(now + 2, slow) == 6
        assert queue.room_by(now + 0.5, slow) == 0
        assert queue.refusal(1, now + 0.5, slow) is not None  # what admission would say
    finally:
        for item in items:  # settle the occupancy gauges
            item.future.set_result(None)


def test_a_probe_answered_503_is_not_a_shed(full: Full) -> None:
    """`/readyz` answers 503 while the server loads or drains: not a shed, so it is not charged
    to the budget (`pipeline_server_shed_cpu_seconds_total`), and the connection it came on
    is not asked to wait; a `POST` shed meanwhile is charged."""

    async def probes(url: str) -> list[int]:
        request = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        reader, writer = await raw_request(url, request)
        statuses = [(await read_answer(reader))[0]]
        for _ in range(4):
            writer.write(request)
            await writer.drain()
            statuses.append((await read_answer(reader))[0])
        writer.close()
        return statuses

    with full() as (served, _):
        served.begin_drain()
        time.sleep(0.1)
        before = sample("pipeline_server_shed_cpu_seconds_total")
        assert asyncio.run(asyncio.wait_for(probes(served.url), 30)) == [503] * 5
        assert sample("pipeline_server_shed_cpu_seconds_total") == before
        answers = asyncio.run(asyncio.wait_for(_storm_connection(served.url, ["one"]), 30))
        assert [s for s, _ in answers] == [503]
        assert sample("pipeline_server_shed_cpu_seconds_total") > before
