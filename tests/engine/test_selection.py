"""Batch selection: the padded partition is optimal, packed batches take the oldest, bounds
hold (MAX_BATCH_SIZE, MAX_BATCH_TOKENS in the tokens a batch computes), nothing starves, and
bulk requests yield to interactive ones, by slices while interactive traffic is recent."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from service.engine.batching.policy import (
    BULK_WINDOW,
    MAX_PASSES,
    PACKED_WINDOW,
    best_run,
    bulk_slice,
    bulk_slice_tokens,
    computed_tokens,
    nearest_run,
    next_batch,
    next_must,
    partition,
)


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


# -- packed batches: real tokens, the oldest and its neighbours in length ------------------------


def test_a_batch_computes_its_real_tokens_packed_and_inputs_x_longest_padded() -> None:
    assert computed_tokens([10, 20, 30, 40], packed=True) == 100
    assert computed_tokens([10, 20, 30, 40], packed=False) == 160
    assert computed_tokens([], packed=True) == computed_tokens([], packed=False) == 0


def test_packed_batches_take_the_oldest_and_the_nearest_in_length_within_both_caps() -> None:
    tokens = [30, 500, 40, 10, 20, 50]  # in arrival order
    assert nearest_run(tokens, must=None, max_size=32, max_tokens=None) == [0, 2, 4, 3, 5, 1]
    # the oldest (30) anchors: 40 and 20 are 10 away, 10 and 50 are 20: the older first
    assert nearest_run(tokens, must=None, max_size=3, max_tokens=None) == [0, 2, 4]
    # the budget counts real tokens: 30 + 40 + 20 + 10 + 50 = 150 fits 150 exactly
    assert nearest_run(tokens, must=None, max_size=32, max_tokens=150) == [0, 2, 4, 3, 5]
    # one that does not fit is passed over; a shorter one after it still fits
    assert nearest_run(tokens, must=None, max_size=32, max_tokens=85) == [0, 2, 3]
    assert nearest_run(tokens[1:], must=None, max_size=32, max_tokens=100) == [0]  # alone
    # a forced input anchors instead: 20's nearest are 30 and 10 (10 away each), the older first
    assert nearest_run(tokens, must=4, max_size=3, max_tokens=None) == [4, 0, 3]
    assert nearest_run([], must=None, max_size=32, max_tokens=None) == []


def test_packed_batches_under_load_come_out_closer_to_length_sorted() -> None:
    """128 closed-loop clients: 128 inputs wait, and each batch's places are taken by as many
    new arrivals. Each batch holds the oldest input and others among the oldest
    PACKED_WINDOW x MAX_BATCH_SIZE, and pads far less than batches in arrival order would
    (measured as inputs x longest over real tokens: what one attention call a batch would
    pad to)."""
    rng = random.Random(3)
    arrivals = [rng.randint(5, 100) for _ in range(128 + 40 * 32)]
    waiting = list(range(128))
    following = iter(range(128, len(arrivals)))
    formed = []
    for _ in range(40):
        picked = nearest_run(
            [arrivals[i] for i in waiting], must=None, max_size=32, max_tokens=None
        )
        assert picked[0] == 0 and len(picked) == 32  # the oldest, a full batch
        assert max(picked) < PACKED_WINDOW * 32  # chosen among the oldest
        formed.append([arrivals[waiting[k]] for k in picked])
        taken = set(picked)
        waiting = [i for k, i in enumerate(waiting) if k not in taken]
        waiting += [next(following) for _ in picked]

    def padding(batches: list[list[int]]) -> float:
        real = sum(sum(b) for b in batches)
        return sum(computed_tokens(b, packed=False) for b in batches) / real

    in_arrival_order = [arrivals[i : i + 32] for i in range(0, 40 * 32, 32)]
    assert padding(formed) <= 0.8 * padding(in_arrival_order)


@pytest.mark.parametrize("seed", range(10))
def test_next_batch_bounds_hold_for_both_ways_of_computing(seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.randint(3, 400) for _ in range(rng.randint(1, 40))]
    max_size, max_tokens = rng.randint(1, 32), rng.choice([None, 256, 1024, 4096])
    for packed in (True, False):
        must = rng.randrange(len(tokens)) if rng.random() < 0.3 else None
        picked = next_batch(
            tokens,
            must=must,
            max_size=max_size,
            max_tokens=max_tokens,
            overhead_tokens=64,
            packed=packed,
        )
        chosen = [tokens[i] for i in picked]
        assert picked and len(set(picked)) == len(picked) <= max_size
        assert must is None or must in picked
        if max_tokens is not None and len(picked) > 1:
            assert computed_tokens(chosen, packed=packed) <= max_tokens
        if packed:
            assert picked[0] == (0 if must is None else must)  # the anchor


def test_padded_next_batch_is_the_best_sorted_run() -> None:
    tokens = [300, 3, 310, 4, 5, 320, 50, 60]  # arrival order; sorted as in the old test
    picked = next_batch(
        tokens, must=None, max_size=32, max_tokens=None, overhead_tokens=200, packed=False
    )
    assert sorted(tokens[i] for i in picked) == [300, 310, 320]
    picked = next_batch(
        tokens, must=3, max_size=32, max_tokens=None, overhead_tokens=200, packed=False
    )
    assert sorted(tokens[i] for i in picked) == [3, 4, 5, 50, 60]


def test_the_cost_model_counts_the_tokens_a_batch_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches of inputs 10, 20, 30 and 40 tokens long: packed, the estimate learns 25 tokens
    an input (their mean), padded 40 (the longest); a fake clock stands still meanwhile."""
    from service.engine.batching import cost

    monkeypatch.setattr(cost.time, "monotonic", lambda: 1000.0)
    lengths = [10, 20, 30, 40]
    for packed, per_input in ((True, 25.0), (False, 40.0)):
        estimate = cost.ServiceTimeEstimate(overhead_tokens=50.0, max_batch_size=4)
        computed = computed_tokens(lengths, packed=packed)
        for _ in range(100):  # the moving averages forget their start (0.8^100)
            estimate.observe(1e-3 * (50 + computed), len(lengths), computed)
        assert estimate.tokens_per_input == pytest.approx(per_input)
        assert estimate.sec_per_token == pytest.approx(1e-3)
        # 8 queued: two batches of overhead plus 8 inputs' computed tokens
        assert estimate.predicted_wait(8) == pytest.approx(1e-3 * (2 * 50 + 8 * per_input))
        estimate.batch_started(computed)  # a running batch adds what it computes
        assert estimate.predicted_wait(0) == pytest.approx(1e-3 * (50 + computed))


@dataclass
class Queued:
    """The fields `next_must` reads of a queued input."""

    name: str
    tokens: int
    bulk: bool = False
    enqueued_at: float = 0.0
    deadline: float = 100.0
    passed_over: int = 0


def simulate(
    pool: list[Queued], arrivals: dict[int, list[Queued]], batches: int
) -> list[list[str]]:
    """Run the batcher's rule for `batches` batches of at most 8 (`next_must`, then `best_run`
    over the candidates); `arrivals[k]` join the pool before batch k. Each batch's names."""
    order: list[list[str]] = []
    for k in range(batches):
        pool += arrivals.get(k, [])
        candidates, must = next_must(pool, now=0.0, urgent_s=0.0, max_size=8)
        group = sorted(candidates, key=lambda q: q.tokens)
        a, b = best_run(
            [q.tokens for q in group],
            must=group.index(must) if must is not None else None,
            max_size=8,
            max_tokens=None,
            overhead_tokens=64,
        )
        chosen = group[a:b]
        order.append([q.name for q in chosen])
        pool[:] = [q for q in pool if q not in chosen]
        for q in pool:
            q.passed_over += 1
    return order


def test_an_interactive_input_runs_in_the_next_batch_while_bulk_inputs_wait() -> None:
    """2,048 bulk inputs of one length queued first; a one-input request arriving before batch
    3 runs in batch 3, not after the 2,048 (256 batches of 8 later)."""
    bulk = [Queued(f"b{i}", 12, bulk=True, enqueued_at=0.0) for i in range(2048)]
    late = Queued("interactive", 40, enqueued_at=1.0)
    batches = simulate(bulk, {3: [late]}, batches=5)
    assert "interactive" in batches[3]
    assert batches[4] == [f"b{i}" for i in range(24, 32)]  # then the bulk goes on, in order


def test_bulk_candidates_are_a_window_in_arrival_order_and_the_oldest_interactive_leads() -> None:
    bulk = [Queued(f"b{i}", 10 + i % 7, bulk=True) for i in range(1000)]
    older = Queued("older", 30, enqueued_at=1.0)
    newer = Queued("newer", 5, enqueued_at=2.0)
    candidates, must = next_must([*bulk, newer, older], now=0.0, urgent_s=0.0, max_size=8)
    assert must is older
    assert [q.name for q in candidates if q.bulk] == [f"b{i}" for i in range(BULK_WINDOW * 8)]
    assert {"older", "newer"} <= {q.name for q in candidates}


def test_without_bulk_the_rule_is_the_padding_aware_one() -> None:
    """No bulk inputs: nothing is forced that the rule without bulk would not force, so the
    most efficient run goes first (the fairness rule changes nothing for interactive load)."""
    pool = [Queued("a", 5, enqueued_at=1.0), Queued("b", 300, enqueued_at=0.0)]
    candidates, must = next_must(pool, now=0.0, urgent_s=0.0, max_size=8)
    assert must is None and len(candidates) == 2
    starving = Queued("c", 300, passed_over=MAX_PASSES)
    assert next_must([*pool, starving], now=0.0, urgent_s=0.0, max_size=8)[1] is starving
    due = Queued("d", 7, deadline=0.5)
    assert next_must([*pool, due], now=0.0, urgent_s=1.0, max_size=8)[1] is due


def test_bulk_waits_behind_interactive_but_is_forced_when_alone() -> None:
    """A starving bulk input does not jump an interactive one; with no interactive input
    left it is forced like any other."""
    starving = Queued("bulk", 300, bulk=True, passed_over=MAX_PASSES)
    small = Queued("small", 5, enqueued_at=3.0)
    assert next_must([starving, small], now=0.0, urgent_s=0.0, max_size=8)[1] is small
    assert next_must([starving], now=0.0, urgent_s=0.0, max_size=8)[1] is starving


def test_a_bulk_slice_takes_the_oldest_inputs_that_fit_its_computed_tokens() -> None:
    """Packed: their sum; padded: their number x the longest; the first always goes."""
    bulk = [Queued(f"b{i}", n, bulk=True) for i, n in enumerate([100, 50, 300, 20, 20])]
    assert [q.name for q in bulk_slice(bulk, 450, packed=True)] == ["b0", "b1", "b2"]
    assert [q.name for q in bulk_slice(bulk, 449, packed=True)] == ["b0", "b1"]
    assert [q.name for q in bulk_slice(bulk, 899, packed=False)] == ["b0", "b1"]  # 3 x 300
    assert [q.name for q in bulk_slice(bulk, 900, packed=False)] == ["b0", "b1", "b2"]
    assert [q.name for q in bulk_slice(bulk, 10, packed=True)] == ["b0"]
    assert bulk_slice([], 10, packed=True) == []


def test_a_bulk_slice_takes_the_slice_time_by_the_cost_model() -> None:
    # 10 ms at 10 us a token, less a 50-token fixed cost: 950 tokens.
    assert bulk_slice_tokens(slice_s=0.010, sec_per_token=1e-5, overhead_tokens=50) == 950
    # A machine 100x slower: 10 ms buys nothing past the fixed cost (a slice of one input).
    assert bulk_slice_tokens(slice_s=0.010, sec_per_token=1e-3, overhead_tokens=64) == 0
    assert bulk_slice_tokens(slice_s=0.050, sec_per_token=1e-4, overhead_tokens=64) == 436


def test_with_a_slice_interactive_inputs_run_alone_and_bulk_in_slices() -> None:
    bulk = [Queued(f"b{i}", 100, bulk=True) for i in range(1000)]
    late = Queued("interactive", 40, enqueued_at=1.0)
    candidates, must = next_must(
        [*bulk, late], now=0.0, urgent_s=0.0, max_size=32, bulk_tokens=950, packed=True
    )
    assert [q.name for q in candidates] == ["interactive"] and must is None
    candidates, must = next_must(bulk, now=0.0, urgent_s=0.0, max_size=32, bulk_tokens=950)
    assert [q.name for q in candidates] == [f"b{i}" for i in range(9)]  # 9 x 100 <= 950
    # Without interactive inputs waiting, a starving bulk input outside the slice cannot be
    # forced into it: the slice's oldest are the forced ones in arrival order.
    bulk[0].passed_over = MAX_PASSES
    candidates, must = next_must(bulk, now=0.0, urgent_s=0.0, max_size=32, bulk_tokens=250)
    assert [q.name for q in candidates] == ["b0", "b1"] and must is bulk[0]
