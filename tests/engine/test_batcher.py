"""The batcher without HTTP: grouping, bounds, dropping before compute, isolating failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from service.engine.batching import forming
from service.engine.batching.batcher import Batcher, State
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.batching.forming import BatchFormer
from service.engine.batching.queue import Item, WorkQueue
from service.engine.batching.running import LastBatch
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.engine.params import PipelineParams
from service.engine.types import Engine, Prepared
from service.errors import DeadlineExceeded, InferenceFailed, InvalidInput, Overloaded
from service.settings import Settings


class RecordingEngine:
    """Wraps the real engine: records each batch's texts; can hold a batch or fail on a text."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.info = engine, engine.info
        self.batches: list[list[str]] = []
        self.texts: dict[int, str] = {}
        self.hold = threading.Event()
        self.hold.set()
        self.poison: str | None = None
        self.before_prepare: Callable[[str], object] | None = None

    def prepare(self, unit: Unit) -> Prepared:
        assert unit.text is not None
        if self.before_prepare is not None:
            self.before_prepare(unit.text)
        prepared = self.engine.prepare(unit)
        self.texts[id(prepared)] = unit.text
        return prepared

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        for unit in units:
            assert unit.text is not None
            if self.before_prepare is not None:
                self.before_prepare(unit.text)
        results = self.engine.prepare_many(units)
        for unit, result in zip(units, results, strict=True):
            if isinstance(result, Prepared):
                self.texts[id(result)] = str(unit.text)
        return results

    def run(self, batch: list[Prepared]) -> list[Any]:
        texts = [self.texts[id(p)] for p in batch]
        self.batches.append(texts)
        assert self.hold.wait(10)
        if self.poison in texts:
            raise RuntimeError("model exploded")
        return self.engine.run(batch)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def batcher(tiny_models: dict[str, Path]) -> Iterator[tuple[Batcher, RecordingEngine]]:
    engines: list[RecordingEngine] = []

    def factory(settings: Settings) -> Any:
        engines.append(RecordingEngine(load_engine(settings)))
        return engines[0]

    b = Batcher(
        Settings(
            model_id=str(tiny_models["fill-mask"]),
            max_batch_size=3,
            max_queue_size=64,
            max_client_batch_size=64,
        ),
        factory,
    )
    b.start()
    until = time.monotonic() + 30
    while b.state is not State.READY and time.monotonic() < until:
        time.sleep(0.01)
    assert b.state is State.READY
    engines[0].batches.clear()
    yield b, engines[0]
    engines[0].hold.set()
    b.stop(10)


def items(texts: list[str], deadline_s: float = 30, **params: Any) -> list[Item]:
    return [
        Item(
            unit=Unit(op=Op.PIPELINE, text=t, params=PipelineParams.of(params, truncate=False)),
            deadline=time.monotonic() + deadline_s,
        )
        for t in texts
    ]


def hold_the_thread(b: Batcher, engine: RecordingEngine) -> Item:
    """Start one batch and keep it running, so what follows queues up behind it."""
    engine.hold.clear()
    blocker = items(["[MASK] blocker"])
    b.queue.offer(blocker, b.estimate)
    until = time.monotonic() + 10
    while not engine.batches and time.monotonic() < until:
        time.sleep(0.005)
    return blocker[0]


def test_parameter_sets_share_batches_within_max_batch_size(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    """Parameters change only each unit's own tokenization and answer, never the forward, so
    units with different parameters share a batch and each gets its own answer."""
    b, engine = batcher
    blocker = hold_the_thread(b, engine)
    a = items([f"a{i} [MASK]" for i in range(4)], top_k=1)
    c = items(["c0 [MASK]"], top_k=2)
    b.queue.offer(a[:2], b.estimate)
    b.queue.offer(c, b.estimate)
    b.queue.offer(a[2:], b.estimate)
    engine.hold.set()
    for item in [blocker, *a, *c]:
        item.future.result(10)
    batches = engine.batches[1:]
    assert sorted(t for batch in batches for t in batch) == sorted(
        [f"a{i} [MASK]" for i in range(4)] + ["c0 [MASK]"]
    )
    assert max(map(len, batches)) == 3  # MAX_BATCH_SIZE, and batches did form
    assert any("c0 [MASK]" in batch and len(batch) > 1 for batch in batches)  # mixed
    assert [len(i.future.result()) for i in a] == [1] * 4  # each its own top_k
    assert len(c[0].future.result()) == 2


def test_cancelled_and_expired_inputs_are_never_computed(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    b, engine = batcher
    cancelled_before = counter("pipeline_server_cancelled_total", reason="client_disconnect")
    expired_before = counter("pipeline_server_expired_total", stage="queued")
    blocker = hold_the_thread(b, engine)
    gone, expiring, kept = (
        items(["gone [MASK]"]),
        items(["late [MASK]"], 0.05),
        items(["ok [MASK]"]),
    )
    b.estimate.sec_per_token, b.estimate.batch_ends_at = 1e-9, 0.0  # admit what will expire
    for group in (gone, expiring, kept):
        b.queue.offer(group, b.estimate)
    assert gone[0].future.cancel()
    time.sleep(0.1)
    engine.hold.set()
    blocker.future.result(10)
    assert isinstance(kept[0].future.result(10), list)
    with pytest.raises(DeadlineExceeded):
        expiring[0].future.result(10)
    computed = [t for batch in engine.batches for t in batch]
    assert "gone [MASK]" not in computed and "late [MASK]" not in computed
    assert counter("pipeline_server_cancelled_total", reason="client_disconnect") == (
        cancelled_before + 1
    )
    assert counter("pipeline_server_expired_total", stage="queued") == expired_before + 1
    assert b.queue.depth == 0


def test_a_failing_input_fails_alone_and_the_thread_lives_on(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    b, engine = batcher
    engine.poison = "bad [MASK]"
    blocker = hold_the_thread(b, engine)
    group = items(["good [MASK]", "bad [MASK]", "fine [MASK]"])
    b.queue.offer(group, b.estimate)
    engine.hold.set()
    blocker.future.result(10)
    assert isinstance(group[0].future.result(10), list)
    assert isinstance(group[2].future.result(10), list)
    with pytest.raises(InferenceFailed) as info:
        group[1].future.result(10)
    assert "exploded" not in info.value.message  # the model's text stays in the log
    after = items(["after [MASK]"])
    b.queue.offer(after, b.estimate)
    assert isinstance(after[0].future.result(10), list)
    assert b.live() == (True, "ready")


def test_an_input_cancelled_while_it_is_tokenized_does_not_stop_the_thread(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    """The loop cancels a request's other inputs as soon as one fails, at any moment; here it
    happens while the thread tokenizes an input that the model then rejects (no mask)."""
    b, engine = batcher
    doomed = items(["first has no mask", "second has none either"])

    def the_loop_cancels_the_second(text: str) -> None:
        if text.startswith("second"):
            doomed[1].future.cancel()

    engine.before_prepare = the_loop_cancels_the_second
    b.queue.offer(doomed, b.estimate)
    with pytest.raises(InvalidInput):
        doomed[0].future.result(10)
    until = time.monotonic() + 10
    while b.queue.depth and time.monotonic() < until:
        time.sleep(0.005)
    assert doomed[1].future.cancelled() and b.queue.depth == 0
    later = items(["still [MASK] serving"])
    b.queue.offer(later, b.estimate)
    assert isinstance(later[0].future.result(10), list)
    assert b.state is State.READY and b.live() == (True, "ready")


def test_queue_bound_counts_inputs_and_sheds_all_or_none(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    b, engine = batcher
    blocker = hold_the_thread(b, engine)
    b.queue.offer(items([f"{i} [MASK]" for i in range(60)]), b.estimate)
    with pytest.raises(Overloaded) as info:
        b.queue.offer(items([f"x{i} [MASK]" for i in range(5)]), b.estimate)
    assert "queue full" in info.value.message
    assert int(info.value.headers["Retry-After"]) >= 1
    assert b.queue.depth == 60
    engine.hold.set()
    blocker.future.result(10)


def test_stop_answers_every_waiter(batcher: tuple[Batcher, RecordingEngine]) -> None:
    b, engine = batcher
    hold_the_thread(b, engine)
    queued = items(["q1 [MASK]", "q2 [MASK]"])
    b.queue.offer(queued, b.estimate)
    threading.Timer(0.2, engine.hold.set).start()
    b.stop(10)
    for item in queued:
        assert item.future.done()
        assert item.future.exception() is not None


def test_inputs_that_cannot_finish_in_time_are_answered_504_before_compute(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    """Under load, an input whose deadline passes before a batch could end (the last batch's
    run time from now) gets 504 at once; the others run."""
    b, engine = batcher
    expired_before = counter("pipeline_server_expired_total", stage="queued")
    blocker = hold_the_thread(b, engine)
    late, ok = items(["late [MASK]"], 1.0), items(["ok [MASK]"])
    b.estimate.sec_per_token, b.estimate.batch_ends_at = 1e-9, 0.0  # admit both
    b.queue.offer(late, b.estimate)
    b.queue.offer(ok, b.estimate)
    time.sleep(0.6)  # the blocker's batch takes 0.6 s: late then has 0.4 s left
    engine.hold.set()
    blocker.future.result(10)
    with pytest.raises(DeadlineExceeded, match="before its batch could end"):
        late[0].future.result(10)
    assert isinstance(ok[0].future.result(10), list)
    assert "late [MASK]" not in [t for batch in engine.batches for t in batch]
    assert counter("pipeline_server_expired_total", stage="queued") == expired_before + 1


def test_when_every_queued_input_looks_doomed_one_still_runs(
    batcher: tuple[Batcher, RecordingEngine],
) -> None:
    """One slow batch (a storm) must not stop the model when it outlasts every queued
    deadline: the input with the latest deadline runs, so batches go on and their run time
    follows the load again."""
    b, engine = batcher
    blocker = hold_the_thread(b, engine)
    first, last = items(["first [MASK]"], 1.0), items(["last [MASK]"], 1.2)
    b.estimate.sec_per_token, b.estimate.batch_ends_at = 1e-9, 0.0
    b.queue.offer(first, b.estimate)
    b.queue.offer(last, b.estimate)
    time.sleep(0.8)  # the blocker's batch takes 0.8 s: 0.2 and 0.4 s are left
    engine.hold.set()
    blocker.future.result(10)
    with pytest.raises(DeadlineExceeded):
        first[0].future.result(10)
    assert isinstance(last[0].future.result(10), list)
    assert ["last [MASK]"] in engine.batches


class CountingEngine:
    """Tokenizes nothing: every unit is a 5-token input (for the pool, without a model)."""

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        return [Prepared(unit=u, n_tokens=5) for u in units]


def former(fixed_s: float = 0.0) -> BatchFormer:
    """A pool of up to 32 inputs whose batches cost `fixed_s` seconds each besides tokens."""
    estimate = ServiceTimeEstimate(max_batch_size=32, overhead_tokens=100.0)
    estimate.sec_per_token = fixed_s / 100.0
    return BatchFormer(Settings(max_batch_size=32, max_queue_size=64), WorkQueue(64), estimate)


def answered_clients_return(
    monkeypatch: pytest.MonkeyPatch, gap_s: float, fixed_s: float, quiet_s: float = 0.05
) -> tuple[int, float]:
    """After a batch of 4 (1 s long), with 4 inputs already pooled, the 4 answered clients'
    requests arrive `gap_s` apart (the first after one gap). Returns the pool's size when
    `await_answered_clients` returns, and how long it waited."""
    monkeypatch.setattr(forming, "_QUIET_S", quiet_s)  # wide margins for a busy CI
    pool = former(fixed_s)
    engine: Any = CountingEngine()
    pool.admit(engine, items([f"queued {i}" for i in range(4)]))
    pool.batch_ended()  # the 4 were waiting when the batch ended

    def clients() -> None:
        for i in range(4):
            time.sleep(gap_s)
            pool.queue.offer(items([f"answered {i}"]), pool.estimate)

    sender = threading.Thread(target=clients)
    sender.start()
    started = time.monotonic()
    pool.await_answered_clients(engine, LastBatch(size=4, seconds=1.0))
    waited = time.monotonic() - started
    sender.join()
    return len(pool.pool), waited


def test_the_next_batch_waits_for_the_clients_just_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A closed loop's answered clients send again within a few ms: the pool waits for them
    (4 queued + 4 answered = one batch of 8, not 4 and 4) while their rate pays for the
    wait: 1 every 10 ms against a fixed cost of 0.5 s a batch (rate x cost = 50 > 8)."""
    pooled, waited = answered_clients_return(monkeypatch, gap_s=0.01, fixed_s=0.5)
    assert pooled == 8
    assert waited < 0.25  # _FILL_SHARE of the last batch's 1 s


def test_the_wait_ends_when_arrivals_are_too_slow_to_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 every 30 ms against a fixed cost of 20 ms a batch (rate x cost = 0.7 < 6 pooled):
    waiting costs more than a larger batch saves, so the batch starts at the second arrival."""
    pooled, waited = answered_clients_return(monkeypatch, gap_s=0.03, fixed_s=0.02)
    assert pooled == 6
    assert waited < 0.2


def test_the_wait_counts_answered_clients_already_pooled_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing waited when the batch of 4 ended; 3 of its clients' next requests are pooled
    before the wait starts (the thread took them first). The wait is for the fourth only and
    ends when it arrives (10 ms), not after a quiet period for clients that do not exist."""
    monkeypatch.setattr(forming, "_QUIET_S", 0.5)
    pool = former(fixed_s=0.5)
    engine: Any = CountingEngine()
    pool.batch_ended()
    pool.admit(engine, items([f"answered {i}" for i in range(3)]))
    sender = threading.Timer(0.01, lambda: pool.queue.offer(items(["answered 3"]), pool.estimate))
    sender.start()
    started = time.monotonic()
    pool.await_answered_clients(engine, LastBatch(size=4, seconds=1.0))
    waited = time.monotonic() - started
    sender.join()
    assert len(pool.pool) == 4
    assert waited < 0.2  # the fourth came at 10 ms; _FILL_SHARE alone would end it at 0.25 s


def test_no_wait_after_a_batch_of_one() -> None:
    """One client: nobody else is coming, the next input runs at once."""
    pool = former()
    engine: Any = CountingEngine()
    pool.admit(engine, items(["alone"]))
    started = time.monotonic()
    pool.await_answered_clients(engine, LastBatch(size=1, seconds=1.0))
    assert time.monotonic() - started < 0.01 and len(pool.pool) == 1
