"""Packed batches in shapes the kernels have seen (`service.backends.packing.token_bucket`).

The packed rows are rounded up to a fixed set of sizes; the pad rows must not change an answer
(float32, bucketed against exact, within 1e-5 for every family and head), and once the server
has warmed the buckets a batch in one of them makes no oneDNN kernel (counted from oneDNN's
own verbose lines in a fresh process, against a batch of exact shapes that does make some).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from test_packed import CASES, random_batch, tiny

from service.backends.packed import PackedForward
from service.backends.packing import Packing, token_bucket, tokens_up_to
from service.engine.loading.choice.candidates import native_bf16

REPO = Path(__file__).resolve().parents[2]


def test_token_buckets_are_few_and_add_fewer_than_64_rows_or_a_sixteenth() -> None:
    buckets = tokens_up_to(8192)
    assert len(buckets) == 64
    assert buckets[:3] == [64, 128, 192] and buckets[-1] == 8192
    known = set(tokens_up_to(20_000))
    for n in range(1, 20_000):
        b = token_bucket(n)
        assert n <= b < n + max(64, n // 16 + 1)
        assert b in known


def test_pad_rows_are_cut_off_and_never_attended() -> None:
    import torch

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    packing = Packing.of(mask, buckets=True)
    assert (packing.tokens, packing.size) == (9, 64)
    packed = packing.pack(torch.arange(12).reshape(3, 4))
    assert packed.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11] + [0] * 55
    rows = torch.randn(64, 6)
    assert torch.equal(packing.unpack(rows)[mask.bool()], rows[:9])
    assert packing.attend(torch.randn(64, 18), heads=2, scale=0.5).shape == (64, 6)


@pytest.mark.parametrize("kind, head", CASES)
def test_bucketed_rows_answer_as_exact_ones_in_float32(kind: str, head: str) -> None:
    import torch

    model = tiny(kind, head)
    exact, bucketed = PackedForward(model, buckets=False), PackedForward(model, buckets=True)
    rng = random.Random(5)
    pad = int(model.config.pad_token_id)
    with torch.inference_mode():
        for size in (1, 3, 8, 17):
            batch = random_batch(rng, 100, pad, size)
            want, got = exact(batch), bucketed(batch)
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= 1e-5


COUNT_SCRIPT = """
import os, sys
from loadtest.kernels import Creations
counter = Creations()
from service.engine.batching.batcher import Batcher
from service.engine.jobs import Op, Unit
from service.engine.params import EmbedParams
from service.settings import Settings

batcher = Batcher(Settings(backend="torch", dtype="bfloat16"))
engine = batcher._load()  # the server's start: load, warm up, warm the buckets, calibrate
packed = engine.backend.packed
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()

def batch(n, length):
    units = [Unit(op=Op.EMBED, text=" ".join(words[(i + j) % 12] for j in range(length + i % 5)),
                  params=EmbedParams(truncate=True)) for i in range(n)]
    prepared = engine.prepare_many(units)
    counter.take()
    engine.run(prepared)
    return sum(p.n_tokens for p in prepared), counter.take()

tokens, made = batch(29, 36)
packed.buckets = False
exact_tokens, exact_made = batch(31, 33)
print("COUNTS", tokens, made, exact_tokens, exact_made, flush=True)
"""


@pytest.mark.skipif(not native_bf16(), reason="bfloat16 runs on oneDNN only with native support")
def test_a_warmed_server_makes_no_kernel_for_a_batch_in_a_known_bucket(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ONEDNN_VERBOSE": "profile_create",
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    out = subprocess.run(
        [sys.executable, "-c", COUNT_SCRIPT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("COUNTS"))
    tokens, made, exact_tokens, exact_made = (int(v) for v in line.split()[1:])
    assert tokens not in tokens_up_to(8192)  # not a bucket's own size: rounded up to one
    assert made == 0
    # the same count on a batch of exact shapes: it makes kernels, so counting works
    assert exact_tokens not in tokens_up_to(8192)
    assert exact_made > 0
