"""MAX_BATCH_TOKENS through the batcher: real tokens when the forward is packed, inputs x the
longest when it is padded; MAX_BATCH_SIZE still caps; a batch of one and a batch at the budget
both run, and every answer equals the same input's answer alone."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import build_sentence_model

from service.backends.torch_backend import TorchBackend
from service.engine.batching.batcher import Batcher, State
from service.engine.batching.queue import Item
from service.engine.forward.encoder import EncoderEngine
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.engine.types import Prepared
from service.settings import Settings

BUDGET = 60


class Recording:
    """The engine, recording each batch's token counts; `hold` keeps a batch running."""

    def __init__(self, engine: EncoderEngine) -> None:
        self.engine, self.info = engine, engine.info
        self.batches: list[list[int]] = []
        self.hold = threading.Event()
        self.hold.set()

    def prepare(self, unit: Unit) -> Prepared:
        return self.engine.prepare(unit)

    def prepare_many(self, units: Sequence[Unit]) -> list[Prepared | Exception]:
        return self.engine.prepare_many(units)

    def run(self, batch: list[Prepared]) -> list[Any]:
        self.batches.append([p.n_tokens for p in batch])
        assert self.hold.wait(10)
        return self.engine.run(batch)


def padded(engine: EncoderEngine) -> EncoderEngine:
    """The same engine computing padded batches."""
    info = dataclasses.replace(engine.info, compute="padded")
    return EncoderEngine(engine.pipe, info, engine.sentence, TorchBackend(engine.pipe.model, "cpu"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget")
    return build_sentence_model(root / "bert", ("mean",), max_seq_length=None)  # 512 tokens


def started(folder: Path, compute: str) -> Iterator[tuple[Batcher, Recording]]:
    engines: list[Recording] = []

    def factory(settings: Settings) -> Any:
        engine = load_engine(settings)
        assert isinstance(engine, EncoderEngine) and engine.info.compute == "packed"
        engines.append(Recording(engine if compute == "packed" else padded(engine)))
        return engines[0]

    settings = Settings(
        model_id=str(folder), max_batch_size=4, max_batch_tokens=BUDGET, max_queue_size=64
    )
    b = Batcher(settings, factory)
    b.start()
    until = time.monotonic() + 30
    while b.state is not State.READY and time.monotonic() < until:
        time.sleep(0.01)
    assert b.state is State.READY
    engines[0].batches.clear()
    yield b, engines[0]
    engines[0].hold.set()
    b.stop(10)


@pytest.fixture
def packed_batcher(folder: Path) -> Iterator[tuple[Batcher, Recording]]:
    yield from started(folder, "packed")


@pytest.fixture
def padded_batcher(folder: Path) -> Iterator[tuple[Batcher, Recording]]:
    yield from started(folder, "padded")


def words(tokens: int) -> str:
    """A text of `tokens` tokens with [CLS] and [SEP] (one word a token here)."""
    return " ".join(["hello"] * (tokens - 2))


def run_behind_a_held_batch(b: Batcher, engine: Recording, lengths: list[int]) -> list[Item]:
    """Queue inputs of `lengths` tokens (in this order) while one batch holds the thread, let
    it go, and return them answered."""
    engine.hold.clear()
    blocker = Item(unit=Unit(op=Op.EMBED, text="blocker"), deadline=time.monotonic() + 30)
    b.queue.offer([blocker], b.estimate)
    until = time.monotonic() + 10
    while not engine.batches and time.monotonic() < until:
        time.sleep(0.005)
    queued = [
        Item(unit=Unit(op=Op.EMBED, text=words(n)), deadline=time.monotonic() + 30) for n in lengths
    ]
    b.queue.offer(queued, b.estimate)
    engine.hold.set()
    for item in [blocker, *queued]:
        item.future.result(10)
    del engine.batches[0]  # the blocker's
    return queued


def same_as_alone(engine: Recording, queued: list[Item]) -> None:
    for item in queued:
        alone = engine.engine.run([engine.engine.prepare(item.unit)])[0]
        assert np.abs(item.future.result() - alone).max() <= 1e-5


def test_packed_batches_hold_max_batch_tokens_real_tokens(
    packed_batcher: tuple[Batcher, Recording],
) -> None:
    b, engine = packed_batcher
    queued = run_behind_a_held_batch(b, engine, [20, 20, 20, 10, 100, 5, 4, 4, 4, 4])
    assert engine.batches == [
        [20, 20, 20],  # 60 real tokens: a batch at MAX_BATCH_TOKENS runs
        [10, 5, 4, 4],  # the oldest and its nearest in length: MAX_BATCH_SIZE (4) caps first
        [100],  # over the budget by itself: alone (a batch of one)
        [4, 4],
    ]
    same_as_alone(engine, queued)


def test_padded_batches_hold_max_batch_tokens_padded_tokens(
    padded_batcher: tuple[Batcher, Recording],
) -> None:
    b, engine = padded_batcher
    queued = run_behind_a_held_batch(b, engine, [10, 30, 30])
    # packed, 10 + 30 = 40 real tokens would fit; padded they are 2 x 30 = 60 and 3 x 30 = 90
    assert all(len(x) * max(x) <= BUDGET for x in engine.batches)
    assert sorted(n for x in engine.batches for n in x) == [10, 30, 30]
    assert [30, 30] in engine.batches  # 60 padded tokens: at the budget, it runs
    same_as_alone(engine, queued)


def test_a_batch_small_enough_for_a_padding_route_counts_its_padded_tokens(
    packed_batcher: tuple[Batcher, Recording],
) -> None:
    """Behind a route whose small-batch backend pads (`ModelInfo.padded_up_to`), a batch of
    at most that many padded tokens computes inputs x the longest; a larger one its real
    tokens. The cost model and the metrics count them so."""
    from prometheus_client import REGISTRY

    def computed() -> float:
        return REGISTRY.get_sample_value("pipeline_server_batch_computed_tokens_sum") or 0.0

    b, engine = packed_batcher
    b.runner.padded_up_to = 40
    before = computed()
    seen = []
    for lengths in ([10, 30], [4, 10]):  # 60 padded: packed, 40; 20 padded: runs padded, 20
        run_behind_a_held_batch(b, engine, lengths)
        seen += engine.batches
        engine.batches.clear()
    assert seen == [[10, 30], [4, 10]]
    assert computed() - before == 9 + 40 + 9 + 20  # the blockers (9 tokens) alone, and these
