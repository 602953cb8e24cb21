"""Padding-aware selection: the partition is optimal, bounds hold, nothing starves."""

from __future__ import annotations

import itertools
import random

import pytest

from service.engine.batching.policy import MAX_PASSES, best_run, partition


def cost(tokens: list[int], runs: list[tuple[int, int]], overhead: float) -> float:
    return sum(overhead + (b - a) * tokens[b - 1] for a, b in runs)


def brute_force(tokens: list[int], max_size: int, overhead: float) -> float:
    """The least cost over every split of the sorted list into contiguous runs."""
    n, best = len(tokens), float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        runs = list(itertools.pairwise(bounds))
        if all(b - a <= max_size for a, b in runs):
            best = min(best, cost(tokens, runs, overhead))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_partition_is_optimal(seed: int) -> None:
    rng = random.Random(seed)
    tokens = sorted(rng.randint(3, 400) for _ in range(rng.randint(1, 10)))
    overhead, max_size = rng.choice([8.0, 64.0, 300.0]), rng.randint(1, 6)
    runs = partition(tokens, max_size=max_size, max_tokens=None, overhead_tokens=overhead)
    assert [a for a, _ in runs][1:] == [b for _, b in runs][:-1]  # contiguous, in order
    assert runs[0][0] == 0 and runs[-1][1] == len(tokens)
    assert cost(tokens, runs, overhead) == pytest.approx(brute_force(tokens, max_size, overhead))


def test_similar_lengths_run_together_and_long_inputs_are_not_padded_into_short() -> None:
    tokens = [3, 4, 5, 50, 60, 300, 310, 320]
    runs = partition(tokens, max_size=32, max_tokens=None, overhead_tokens=200)
    assert runs == [(0, 5), (5, 8)]
    assert best_run(tokens, must=None, max_size=32, max_tokens=None, overhead_tokens=200) == (5, 8)
    assert best_run(tokens, must=1, max_size=32, max_tokens=None, overhead_tokens=200) == (0, 5)


def test_max_batch_tokens_bounds_padded_tokens_but_a_single_input_always_runs() -> None:
    tokens = [100, 100, 100, 100, 900]
    runs = partition(tokens, max_size=32, max_tokens=250, overhead_tokens=50)
    assert all((b - a) * tokens[b - 1] <= 250 or b - a == 1 for a, b in runs)
    assert (4, 5) in runs


def test_nothing_starves_under_a_steady_stream_of_short_inputs() -> None:
    """Simulate the batcher's rule: a long input arrives among ever-new short ones; it is
    forced in after at most MAX_PASSES batches."""
    pool = [(400, "long")] + [(5, f"s{i}") for i in range(8)]
    passes = {name: 0 for _, name in pool}
    fresh = itertools.count(100)
    for batch_no in range(MAX_PASSES + 2):
        pool.sort()
        forced = [i for i, (_, name) in enumerate(pool) if passes[name] >= MAX_PASSES]
        a, b = best_run(
            [t for t, _ in pool],
            must=forced[0] if forced else None,
            max_size=8,
            max_tokens=None,
            overhead_tokens=64,
        )
        chosen = {name for _, name in pool[a:b]}
        if "long" in chosen:
            assert batch_no <= MAX_PASSES
            return
        pool = [p for p in pool if p[1] not in chosen]
        for _, name in pool:
            passes[name] += 1
        for _ in range(8):
            name = f"s{next(fresh)}"
            pool.append((5, name))
            passes[name] = 0
    raise AssertionError("the long input starved")
