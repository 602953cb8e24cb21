"""Requests waiting and running (the inference gateway's gauges,
`service.engine.batching.occupancy`),
compared with what the batcher is doing: each batch is held while the test reads the gauges."""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import load
import pytest
from inprocess import Recorder, serve
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from service.engine.batching.batcher import Batcher, State
from service.engine.batching.queue import Item
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.engine.types import Engine, Prepared
from service.errors import DeadlineExceeded, Overloaded
from service.settings import Settings

WAITING, RUNNING = "pipeline_server_requests_waiting", "pipeline_server_requests_running"


class SteppingEngine:
    """Wraps the real engine. Once `step` is set, every batch announces its texts on `entered`
    and waits for `proceed` before it computes, so the test reads the gauges mid-batch."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.info = engine, engine.info
        self.texts: dict[int, str] = {}
        self.step = False
        self.entered: queue.Queue[list[str]] = queue.Queue()
        self.proceed = threading.Semaphore(0)
        self.ran: list[str] = []

    def prepare(self, unit: Unit) -> Prepared:
        prepared = self.engine.prepare(unit)
        self.texts[id(prepared)] = str(unit.text)
        return prepared

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        results = self.engine.prepare_many(units)
        for unit, result in zip(units, results, strict=True):
            if isinstance(result, Prepared):
                self.texts[id(result)] = str(unit.text)
        return results

    def run(self, batch: list[Prepared]) -> list[Any]:
        texts = [self.texts.get(id(p), "?") for p in batch]
        if self.step:
            self.ran.extend(texts)
            self.entered.put(texts)
            assert self.proceed.acquire(timeout=20), "the test never let the batch go"
        return self.engine.run(batch)

    def next_batch(self) -> list[str]:
        return self.entered.get(timeout=10)


@contextmanager
def stepping_batcher(model: Path, **settings: Any) -> Iterator[tuple[Batcher, SteppingEngine]]:
    """A started batcher on `model` whose engine steps (see `SteppingEngine`) once ready."""
    engines: list[SteppingEngine] = []

    def factory(settings: Settings) -> Any:
        engines.append(SteppingEngine(load_engine(settings)))
        return engines[0]

    b = Batcher(Settings(model_id=str(model), **settings), factory)
    b.start()
    until = time.monotonic() + 30
    while b.state is not State.READY and time.monotonic() < until:
        time.sleep(0.01)
    assert b.state is State.READY
    engines[0].step = True
    try:
        yield b, engines[0]
    finally:
        engines[0].step = False
        for _ in range(64):
            engines[0].proceed.release()
        b.stop(10)


@pytest.fixture
def stepper(tiny_models: dict[str, Path]) -> Iterator[tuple[Batcher, SteppingEngine]]:
    with stepping_batcher(tiny_models["fill-mask"], max_batch_size=3, max_queue_size=64) as made:
        yield made


def offer(b: Batcher, texts: list[str], deadline_s: float = 30) -> list[Item]:
    """One request of `texts` (fill-mask inputs), queued as `Runtime.submit` queues it."""
    deadline = time.monotonic() + deadline_s
    items = [Item(unit=Unit(op=Op.PIPELINE, text=t), deadline=deadline) for t in texts]
    b.queue.offer(items, b.estimate)
    return items


def gauges(b: Batcher) -> tuple[int, int]:
    """(waiting, running) as counted and as the exported gauges say (they must agree)."""
    occupancy = b.queue.occupancy
    exported = (REGISTRY.get_sample_value(WAITING), REGISTRY.get_sample_value(RUNNING))
    assert exported == (occupancy.waiting, occupancy.running)
    return occupancy.waiting, occupancy.running


def expected(requests: dict[str, list[Item]], batch: list[str]) -> tuple[int, int]:
    """What the batcher is doing, counted per request: running when one of its inputs is in
    the held `batch`, else waiting while one of its inputs is unanswered."""
    running = waiting = 0
    for items in requests.values():
        texts = {i.unit.text for i in items}
        if texts & set(batch):
            running += 1
        elif any(not i.future.done() for i in items):
            waiting += 1
    return waiting, running


def release_all(engine: SteppingEngine, items: list[Item]) -> None:
    """Let batches go until every item is settled."""
    until = time.monotonic() + 20
    while not all(i.future.done() for i in items):
        assert time.monotonic() < until, "items never settled"
        engine.proceed.release()
        time.sleep(0.01)


def test_a_request_counts_once_and_waits_between_the_batches_its_inputs_are_split_into(
    stepper: tuple[Batcher, SteppingEngine],
) -> None:
    b, engine = stepper
    blocker = offer(b, ["[MASK] blocker"])
    assert engine.next_batch() == ["[MASK] blocker"]
    assert gauges(b) == (0, 1)
    requests = {
        "blocker": blocker,
        "split": offer(b, [f"split {i} [MASK]" for i in range(5)]),  # MAX_BATCH_SIZE is 3
        "single": offer(b, ["single [MASK]"]),
    }
    assert gauges(b) == (2, 1)  # two requests waiting, six inputs
    assert b.queue.depth == 6
    batches: list[list[str]] = []
    engine.proceed.release()
    while sum(map(len, batches)) < 6:
        batch = engine.next_batch()
        batches.append(batch)
        assert gauges(b) == expected(requests, batch), batches
        engine.proceed.release()
    for items in requests.values():
        for item in items:
            assert isinstance(item.future.result(10), list)
    split_batches = [bt for bt in batches if any(t.startswith("split") for t in bt)]
    assert len(split_batches) >= 2, "the 5 inputs ran in batches of at most 3"
    assert gauges(b) == (0, 0) and b.queue.depth == 0


def test_a_cancelled_request_stops_counting_at_once_and_a_running_one_when_its_batch_ends(
    stepper: tuple[Batcher, SteppingEngine],
) -> None:
    b, engine = stepper
    blocker = offer(b, ["[MASK] blocker"])
    engine.next_batch()
    gone = offer(b, ["gone 1 [MASK]", "gone 2 [MASK]"])
    assert gauges(b) == (1, 1)
    for item in gone:  # what `service.runtime.runtime._abandon` does when the client leaves
        item.cancel_reason = "client_disconnect"
        assert item.future.cancel()
    assert gauges(b) == (0, 1), "the client left: no longer waiting"
    assert b.queue.depth == 2, "the inputs stay queued until the thread drops them"
    engine.proceed.release()
    blocker[0].future.result(10)
    until = time.monotonic() + 10
    while b.queue.depth and time.monotonic() < until:
        time.sleep(0.005)
    assert b.queue.depth == 0 and gauges(b) == (0, 0)

    partly = offer(b, [f"part {i} [MASK]" for i in range(5)])
    first = engine.next_batch()
    assert len(first) == 3 and gauges(b) == (0, 1)
    cancelled = [i.future.cancel() for i in partly]  # the deadline passed, say
    assert cancelled.count(True) == 2, "the 3 running inputs cannot be cancelled"
    assert gauges(b) == (0, 1), "its batch still computes 3 of its inputs"
    engine.proceed.release()
    release_all(engine, partly)
    assert gauges(b) == (0, 0)
    assert not {"gone 1 [MASK]", "gone 2 [MASK]"} & set(engine.ran)
    assert len([t for t in engine.ran if t.startswith("part")]) == 3


def test_expired_while_queued_and_shed_at_admission(
    stepper: tuple[Batcher, SteppingEngine],
) -> None:
    b, engine = stepper
    blocker = offer(b, ["[MASK] blocker"])
    engine.next_batch()
    b.estimate.sec_per_token, b.estimate.batch_ends_at = 1e-9, 0.0  # admit what will expire
    late = offer(b, ["late [MASK]"], deadline_s=0.05)
    kept = offer(b, [f"kept {i} [MASK]" for i in range(60)])  # 61 of 64 inputs queued
    assert gauges(b) == (2, 1)
    with pytest.raises(Overloaded):  # shed: never counted
        offer(b, [f"shed {i} [MASK]" for i in range(4)])
    assert gauges(b) == (2, 1)
    time.sleep(0.1)
    engine.step = False  # no more holding: let everything run
    engine.proceed.release()
    blocker[0].future.result(10)
    with pytest.raises(DeadlineExceeded):
        late[0].future.result(10)
    for item in kept:
        item.future.result(10)
    assert "late [MASK]" not in engine.ran
    assert gauges(b) == (0, 0) and b.queue.depth == 0


def test_exact_under_concurrent_offers_cancellations_and_deadlines(
    tiny_models: dict[str, Path],
) -> None:
    """Six threads queue 40 requests each (1-4 inputs; some cancelled at once, some with
    deadlines that pass in the queue or shed them at admission) while a sampler reads the
    counts: they never go negative, never more requests run than a batch holds, and they end
    at zero."""
    with stepping_batcher(tiny_models["fill-mask"], max_batch_size=16, max_queue_size=256) as (
        b,
        engine,
    ):
        engine.step = False
        _storm_of_offers(b)


def _storm_of_offers(b: Batcher) -> None:
    outstanding: list[list[Item]] = []
    lock = threading.Lock()
    stop = threading.Event()
    bad: list[tuple[int, int]] = []
    shed: list[int] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for n in range(40):
            texts = [f"c{seed} r{n} i{k} [MASK]" for k in range(rng.randint(1, 4))]
            try:
                items = offer(b, texts, deadline_s=rng.choice([0.01, 0.05, 30, 30]))
            except Overloaded:  # shed: never counted
                with lock:
                    shed.append(len(texts))
                continue
            with lock:
                outstanding.append(items)
            if rng.random() < 0.25:
                for item in items:
                    item.future.cancel()
            time.sleep(rng.random() * 0.03)

    def sampler() -> None:
        while not stop.is_set():
            waiting, running = b.queue.occupancy.waiting, b.queue.occupancy.running
            # A batch holds at most MAX_BATCH_SIZE (16) inputs: at most 16 requests run.
            if waiting < 0 or running < 0 or running > 16:
                bad.append((waiting, running))
            time.sleep(0.001)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(6)]
    watcher = threading.Thread(target=sampler)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for items in outstanding:
        for item in items:
            _settled(item.future)
    stop.set()
    watcher.join(10)
    assert not bad, bad[:5]
    assert len(outstanding) > 80 and len(outstanding) + len(shed) == 240
    assert gauges(b) == (0, 0) and b.queue.depth == 0


def _settled(future: Future[Any]) -> None:
    until = time.monotonic() + 20
    while not future.done():
        assert time.monotonic() < until
        time.sleep(0.002)


# --- through HTTP -----------------------------------------------------------------------------


def scrape(url: str) -> dict[str, tuple[str, float]]:
    """The gauges of /metrics: name -> (HELP text, value)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.type == "gauge" and family.samples:
            found[family.name] = (family.documentation, family.samples[0].value)
    return found


@pytest.fixture
def held(tiny_models: dict[str, Path]) -> Iterator[tuple[str, Recorder, Callable[..., Any]]]:
    recorder = Recorder()
    settings = Settings(model_id=str(tiny_models["text-classification"]), torch_num_threads=1)
    with serve(settings, recorder) as served:
        yield served.url, recorder, lambda: served.depth
        recorder.gate.set()


def test_metrics_list_the_gauges_and_follow_http_requests(
    held: tuple[str, Recorder, Callable[..., Any]],
) -> None:
    url, recorder, depth = held
    gauges_now = scrape(url)
    assert "TotalQueuedRequests" in gauges_now[WAITING][0]
    assert "TotalRunningRequests" in gauges_now[RUNNING][0]
    assert "Gateway API Inference Extension" in gauges_now[WAITING][0]

    async def scenario() -> list[load.Outcome]:
        async with load.session() as client:

            def post(inputs: Any, **headers: str) -> Any:
                return asyncio.create_task(
                    load.post(client, url + "/", json={"inputs": inputs}, headers=headers)
                )

            recorder.gate.clear()
            blocker = post("blocker")
            await asyncio.to_thread(recorder.wait_ran, "blocker")
            pair = post(["first of two", "second of two"])
            short = post("short deadline", **{"X-Request-Timeout": "0.5"})
            await asyncio.sleep(0.2)
            before = scrape(url)
            assert (before[WAITING][1], before[RUNNING][1]) == (2, 1)
            assert depth() == 3
            expired = await short  # the runtime cancels it at its deadline: 504
            assert expired.status == 504
            after = scrape(url)
            assert (after[WAITING][1], after[RUNNING][1]) == (1, 1)
            assert depth() == 3, "its input stays queued until the thread drops it"
            recorder.gate.set()
            return [await blocker, await pair, expired]

    blocker, pair, _ = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert blocker.status == 200 and pair.status == 200
    assert "short deadline" not in recorder.ran
    final = scrape(url)
    assert (final[WAITING][1], final[RUNNING][1]) == (0, 0)
