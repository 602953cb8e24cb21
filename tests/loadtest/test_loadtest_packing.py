"""loadtest.experiments.packing: the batches it times, the tokens they compute, its table,
and one short run of its own engines (the padded and packed ways give the same vectors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from models import build_sentence_model

from loadtest.experiments import packing
from service.engine.jobs import Op, Unit
from service.engine.loading.load import load_engine
from service.settings import Settings


def test_batches_in_arrival_order_and_length_sorted() -> None:
    lengths = [5, 40, 10, 30, 20]
    assert packing.batches(lengths, 2, sort=False) == [[0, 1], [2, 3], [4]]
    ordered = packing.batches(lengths, 2, sort=True)  # [[0, 2], [4, 3], [1]], shuffled
    assert sorted(ordered) == [[0, 2], [1], [4, 3]] and ordered != [[0, 2], [4, 3], [1]]
    assert packing.batches(lengths, 2, sort=True) == ordered  # the same shuffle every time
    arrival = packing.batches(lengths, 2, sort=False)
    # padded: 2 x 40 + 2 x 30 + 20 = 160 tokens for 105 real; packed: 105
    assert packing.computed_per_real(lengths, arrival, packed=False) == pytest.approx(160 / 105)
    assert packing.computed_per_real(lengths, arrival, packed=True) == 1.0
    assert packing.computed_per_real(lengths, ordered, packed=False) == pytest.approx(120 / 105)


def test_batches_formed_under_load_hold_each_input_once_near_its_oldest() -> None:
    lengths = [50, 10, 52, 11, 49, 12, 90]
    formed = packing.formed(lengths, 2, pool=4)
    assert sorted(i for b in formed for i in b) == list(range(len(lengths)))  # each once
    # pool [50, 10, 52, 11]: the oldest (50) with 52; then 10 with 11; then [49, 12, 90]
    # (49 and 12 arrived): 49 with 12 (the nearer of the two); 90 alone at the end
    assert sorted(formed) == [[0, 2], [1, 3], [4, 5], [6]]
    assert packing.formed(lengths, 2, pool=4) == formed  # the same shuffle every time


def test_the_table_gives_each_way_against_arrival_order_padded() -> None:
    rows = [
        {"backend": "torch", "dtype": "float32", "order": "arrival", "compute": "padded",
         "inputs_per_s": 100.0, "cpu_ms_per_input": 20.0, "computed_per_real": 1.86},
        {"backend": "torch", "dtype": "float32", "order": "arrival", "compute": "packed",
         "inputs_per_s": 180.0, "cpu_ms_per_input": 11.0, "computed_per_real": 1.0},
        {"backend": "torch", "dtype": "float32", "order": "formed", "compute": "packed",
         "inputs_per_s": 190.0, "cpu_ms_per_input": 10.5, "computed_per_real": 1.0},
        {"backend": "onnx", "dtype": "float32", "skipped": "not served here"},
    ]  # fmt: skip
    lines = packing.table(rows).splitlines()
    assert lines[2] == "| torch float32 | arrival order, padded | 100.0 | 1.00 | 20.0 | 1.86 |"
    assert lines[3] == "| torch float32 | arrival order, packed | 180.0 | 1.80 | 11.0 | 1.00 |"
    assert lines[4] == "| torch float32 | formed under load, packed | 190.0 | 1.90 | 10.5 | 1.00 |"
    assert lines[5].startswith("| onnxruntime float32 | not served here |")


def test_its_ways_answer_alike_and_time_batches(tmp_path: Path) -> None:
    engine = load_engine(Settings(model_id=str(build_sentence_model(tmp_path / "m", ("mean",)))))
    ways = packing.ways(engine)
    assert sorted(ways) == ["packed", "padded"]
    texts = ["a", "paris is the capital of france", "big small good bad happy sad " * 3]
    units = [Unit(op=Op.EMBED, text=t) for t in texts]
    padded, packed = (np.stack(ways[w].run(ways[w].prepare_many(units))) for w in ways)
    assert np.abs(padded - packed).max() <= 1e-5
    timed = packing.Timed(ways["packed"], texts, [[0, 1], [2]])
    timed.run_for(0.05)
    assert timed.inputs >= 2 and timed.rate() > 0 and timed.cpu_ms() > 0
