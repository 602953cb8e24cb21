"""The workloads' parts without a server (the benchmark's and the studies'): short inputs, /proc
readings, py-spy's raw format, the bench models, and the tables each workload prints."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from loadtest import corpus, proc, servers
from loadtest.bench import parse_args
from loadtest.experiments import batch_tokens, burst, cpu_split, memory, pyspy, zero_shot
from loadtest.experiments.bench import WORKLOADS as STUDIES
from loadtest.workloads import (
    WORKLOADS,
    bulk,
    cost,
    hybrid,
    short_inputs,
    static,
    storm,
    storm_kinds,
)


def test_short_inputs_are_8_to_100_tokens_about_42_mean(embedded_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_model))
    texts = corpus.short_inputs(2000)
    assert texts == corpus.short_inputs(2000) and texts != corpus.short_inputs(2000, seed=1)
    lengths = [len(ids) for ids in tok(texts)["input_ids"]]
    assert min(lengths) >= 8 and max(lengths) <= 100
    assert 40 <= statistics.fmean(lengths) <= 44
    assert len(set(texts)) > 400  # the corpus is small, but cut points vary
    assert sum(n < 20 for n in lengths) > 100 and sum(n > 70 for n in lengths) > 50  # spread
    assert corpus.inputs("short", 5) == texts[:5] and corpus.inputs("mixed", 3)
    with pytest.raises(ValueError, match="unknown input set"):
        corpus.inputs("long", 1)


def test_cpu_window_charges_a_named_thread() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin, name="busy")
    busy.start()
    try:
        window = proc.CpuWindow(os.getpid(), {busy.native_id or 0: "inference"})
        window.start()
        time.sleep(0.3)
        split = window.stop()
    finally:
        stop.set()
        busy.join()
    assert split.wall_s >= 0.3 and split.cpu_s["inference"] > 0.1
    assert set(split.cpu_s) <= {"loop", "inference", "other"}
    summary = split.summary(requests=10, inputs=5)
    assert summary["inference_ms_per_input"] > 20 and summary["inference_cores"] > 0.3


def _steal_s(cpu: int) -> float:
    """Seconds the host took from ``cpu`` so far (/proc/stat's steal column, in ticks)."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == f"cpu{cpu}":
            return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def test_cpu_window_counts_the_time_a_thread_waits_for_a_core() -> None:
    """A thread always runnable, pinned to one core beside a spinning process, waits for that
    core a good part of the time: schedstat's runnable time, `inference_waiting_cores`. How the
    core is split is the scheduler's (about half, less when other work runs there too), so the
    test holds the accounting: a thread runnable all along was on the core or waiting for it,
    run + wait about the window, time the host took from the core (steal) aside. The thread
    hashes, which releases the GIL, so no other thread of this process can make it sleep on
    the GIL instead; the window opens once the rival process spins."""
    cpu = min(os.sched_getaffinity(0))
    stop, ready = threading.Event(), threading.Event()
    block = bytes(1 << 20)

    def spin() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        ready.set()
        while not stop.is_set():
            hashlib.sha256(block).digest()

    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    busy = threading.Thread(target=spin, name="busy")
    try:
        os.sched_setaffinity(rival.pid, {cpu})
        started, deadline = psutil.Process(rival.pid), time.monotonic() + 30
        while sum(started.cpu_times()[:2]) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)  # past its start (which reads files) and spinning
        busy.start()
        assert ready.wait(5)
        steal = _steal_s(cpu)
        window = proc.CpuWindow(os.getpid(), {busy.native_id or 0: "inference"})
        window.start()
        time.sleep(1.0)
        split = window.stop()
        steal = (_steal_s(cpu) - steal) / split.wall_s
    finally:
        stop.set()
        rival.kill()
        rival.wait()
        if busy.is_alive():
            busy.join()
    summary = split.summary(requests=1, inputs=1)
    waited, ran = summary["inference_waiting_cores"], summary["inference_cores"]
    assert waited > 0.2 and ran > 0
    # on the core or waiting for it all along; a wait or a run under way at either end of the
    # window is counted when it ends, and steal is neither
    assert waited + ran + steal > 0.8 and waited + ran < 1.2


def test_loop_sampler_reads_a_threads_state_and_names_syscalls() -> None:
    sampler = cpu_split.LoopSampler(os.getpid(), hz=200)
    sampler.start()
    time.sleep(0.5)  # the main thread sleeps: a syscall other than futex and epoll
    states = sampler.stop()
    assert sum(states.values()) == pytest.approx(1.0) and states.get("other", 0) > 0.5
    assert [cpu_split.classify(s) for s in ("running", "202", "281", "0")] == [
        "running",
        "futex",
        "epoll",
        "other",
    ]


def test_roles_and_rss() -> None:
    pid = os.getpid()
    here = threading.get_native_id()
    roles = proc.roles(pid, {here: "inference"} if here != pid else {})
    assert roles[pid] == "loop"
    assert memory.rss_bytes(pid) > 10 * 2**20


RAW = """\
thread (101): MainThread;Runner.run (asyncio/runners.py:118);Protocol.data_received (h11.py:20) 7
thread (101): MainThread;Runner.run (asyncio/runners.py:118);json_response (routes.py:30) 3
thread (102): inference;Batcher._run (service/engine/batcher.py:240);Engine.run (model.py:180);\
Module._call_impl (torch/nn/modules/module.py:1789);Linear.forward (torch/nn/linear.py:134) 20
thread (102): inference;Batcher._run (service/engine/batcher.py:240);Engine.prepare (model.py:120) 5
not a stack line
"""


def test_pyspy_raw_parses_and_adds_up() -> None:
    stacks = pyspy.parse_raw(RAW)
    assert len(stacks) == 4 and stacks[0].tid == 101 and stacks[2].count == 20
    assert pyspy.per_thread(stacks) == {"MainThread": 10, "inference": 25}
    top, n = pyspy.top(stacks, "MainThread", 5)
    assert n == 10 and top[0] == ("Protocol.data_received (h11.py)", 0.7)
    incl, _ = pyspy.top(stacks, "MainThread", 3, inclusive=True)  # Runner.run: on every stack
    assert incl == [("Protocol.data_received (h11.py)", 0.7), ("json_response (routes.py)", 0.3)]
    outside, n = pyspy.top(stacks, "inference", 5, skip=pyspy.outside_forward)
    assert n == 5 and outside == [("Engine.prepare (model.py)", 1.0)]
    waiting = pyspy.parse_raw(
        "thread (102): inference;Batcher._step (b.py:1);WorkQueue.take_new (q.py:91);"
        "Condition.wait (threading.py:331);PyThread_acquire_lock_timed (libpython3.11.so) 9\n"
        "thread (101): MainThread;Runner.run (runners.py:118);uv__io_poll (linux.c:1);"
        "epoll_wait (libc.so.6) 4"
    )
    assert all(pyspy.idle(stack) for stack in waiting) and not any(map(pyspy.idle, stacks))
    assert cpu_split.gil_shares(stacks, seconds=1.0) == {"MainThread": 0.1, "inference": 0.25}


def test_pyspy_command_line() -> None:
    cmd = pyspy.record_command(42, 5, Path("/tmp/x.txt"), gil=True)
    assert cmd[1:3] == ["record", "--pid"] and "--gil" in cmd and "--nonblocking" in cmd
    assert cmd[cmd.index("--format") + 1] == "raw"
    native = pyspy.record_command(42, 5, Path("/tmp/x.txt"), native=True)
    assert "--native" in native and "--nonblocking" not in native  # py-spy refuses both


def test_parse_env() -> None:
    assert servers.parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        servers.parse_env(["novalue"])


def test_rss_growth_reads_half_time_and_end() -> None:
    mb = 2**20
    samples = [(0.0, 500 * mb), (30.0, 600 * mb), (60.0, 610 * mb), (119.0, 630 * mb)]
    got = memory.growth(samples, 120)
    assert got["rss_half_mb"] == 610 and got["rss_end_mb"] == 630
    assert got["growth"] == pytest.approx(630 / 610 - 1)


def test_storm_input_is_three_sentences() -> None:
    text = storm.storm_input()
    assert text.startswith("Four score") and text.count(". ") == 2


def test_bench_knows_every_workload_and_parses_only() -> None:
    named = ["mixed", "short_inputs", "storm", "cost", "retrieval", "token-pooling", "bulk"]
    assert list(WORKLOADS) == [*named, "hybrid", "static", "late-chunking"]
    studies_named = ["cpu", "profile", "burst", "memory", "zero_shot", "pooled", "batch_tokens"]
    assert list(STUDIES) == studies_named
    args = parse_args(["--only", "storm,short_inputs", "--quick", "--ab", "X=1"])
    assert args.only == ["storm", "short_inputs"] and args.storm_rounds == 2
    assert args.short_inputs == 500
    mixed = parse_args(["--only", "mixed", "--results", "/tmp/r"])
    assert mixed.out == Path("/tmp/r/bench.json") and mixed.levels == [1, 4, 16, 32, 64]
    studies = parse_args(["--only", "burst,memory", "--quick"], STUDIES)
    assert studies.only == ["burst", "memory"] and studies.burst_count == 4
    assert studies.minutes == 2.0 and studies.workloads is STUDIES
    budgets = parse_args(["--only", "batch_tokens", "--quick"], STUDIES)
    assert budgets.budget_seconds == 6 and budgets.budget_rounds == 1
    assert budgets.budgets == "none,2048,4096,8192"
    for unknown in (["--only", "nope"], ["--only", "burst"]):  # a study is not the bench's
        with pytest.raises(SystemExit):
            parse_args(unknown)


def _point(**extra: Any) -> dict[str, Any]:
    return {
        "ok_per_s": 100.0,
        "requests": 500,
        "p50_ms": 10.0,
        "p95_ms": 20.0,
        "p99_ms": 30.0,
        "statuses": {},
        "errors": {"status": 0},
        "loop_ms_per_request": 1.25,
        "inference_ms_per_input": 3.5,
        "other_ms_per_input": 2.0,
        "other_cpu": 0.01,
        **extra,
    }


def test_short_inputs_summary_and_table() -> None:
    paired = {
        32: [
            _point(round=r, ratio=x, over_alone=y, limit_b_before=120.0, limit_b_after=125.0)
            for r, x, y in ((1, 0.7, 0.9), (2, 0.8, 0.95), (3, 0.75, 1.0))
        ]
    }
    paired[32][0].update(inference_waiting_cores=0.03, other_waiting_cores=0.015)
    res: dict[str, Any] = {
        "task": "text-classification",
        "answer": "labels",
        "limit": {"by_batch_size": {16: 120.0, 32: 130.0}, "best_batch_size": 32, "best": 130.0},
        "closed": {1: _point(), 32: _point()},
        "paired": paired,
        "one_client": [{"p50_ms": 9.0, "single_p50_ms": 7.0}],
    }
    res["summary"] = short_inputs.summarize(res)
    assert res["summary"]["ratio_at_32"] == 0.75 and res["summary"]["over_alone_at_32"] == 0.95
    text = short_inputs.table(
        {
            "inputs": {"n": 10, "tokens_mean": 42.0, "tokens_min": 8, "tokens_max": 99},
            "cases": {"classification": res},
        }
    )
    assert "throughput / limit (b) 0.75 (target >= 0.78)" in text
    rounds = [line for line in text.splitlines() if line.startswith(("| 1 | 32 |", "| 2 | 32 |"))]
    assert "| 4.5% |" in rounds[0] and "| - |" in rounds[1]  # waits for a core, when recorded
    assert "| 32 | 100.0 | 10.0 | 20.0 | 30.0 | 0 | 1.25 | 3.50 | 2.00 | 1% |" in text


def test_burst_and_storm_tables() -> None:
    lat = {"p50_ms": 5.0, "p95_ms": 9.0, "p99_ms": 12.0}
    text = burst.table(
        {
            "size": 160,
            "count": 2,
            "floor": lat,
            "shed": {**lat, "p95_ms": 15.0},
            "livez": lat,
            "floor_n": 320,
            "shed_n": 300,
            "livez_n": 16,
            "post_statuses": {503: 300, 200: 20},
            "shed_p95_over_floor_ms": 6.0,
            "livez_p95_over_floor_ms": 0.0,
        }
    )
    assert "| sheds (503) in the burst | 300 | 5.0 | 15.0 | 12.0 | 6.0 | <= 10 |" in text
    rnd = _point(
        config="A",
        round=1,
        kind="differing",
        capacity_per_s=50.0,
        goodput_over_capacity=0.1,
        shed_per_s=900.0,
        expired_per_s=2.0,
        loop_cores=0.4,
        client_cores=0.6,
        polite={"statuses": {503: 3}, "shed": lat, "ok": lat},
        probes={"sent": 40, "failed": 0, "max_ms": 7.25},
        acted={"held": 120.0, "shed_cpu_s": 1.5},
        batching={
            "mean_batch": 12.0,
            "padded_tokens_per_input": 30.0,
            "pipeline_ms_per_input": 9.5,
        },
        capacity={
            "statuses": {"503": 4, "200": 90},
            "other_cpu": 0.05,
            "client_cores": 0.2,
            "batching": {"pipeline_ms_per_input": 4.75},
        },
    )
    text = storm.table(
        {
            "args": {"storm_seconds": "20"},
            "configs": {"A": {"Q": "1"}},
            "rounds": [rnd],
        }
    )
    assert (
        "| differing | A | 1 | 50.0 | 100.0 | 0.10 | 900 | 2.0 | {503: 3} | 5.0 / 9.0 "
        "| 40, 0, 7.2 | 120 | 1.50 | 0.40 | 0.60 (0.20) | 5% | 9.5 (4.8) |" in text
    )  # (in brackets: the capacity run's)
    retried = storm.table({"args": {}, "configs": {"A": {}}, "rounds": [{**rnd, "attempts": 3}]})
    assert "| 0.60 (0.20) | 5% (3 attempts) | 9.5 (4.8) |" in retried
    no_batches = storm.table(
        {"args": {}, "configs": {"A": {}}, "rounds": [{**rnd, "batching": {}, "capacity": {}}]}
    )
    assert no_batches.splitlines()[-3].endswith("| - (-) |")


def test_batching_is_read_from_the_counters_differences() -> None:
    """Mean batch, padded tokens and pipeline ms per input over a window, from the growth of
    the batch-size and padded-token histograms' sums and counts and the pipeline seconds."""
    acted = {"batches": 10.0, "batch_inputs": 80.0, "padded_tokens": 2400.0, "inference_s": 0.4}
    assert storm_kinds.batching(acted) == {
        "mean_batch": 8.0,
        "padded_tokens_per_input": 30.0,
        "pipeline_ms_per_input": 5.0,
    }
    assert storm_kinds.batching({"batches": 0.0, "batch_inputs": 0.0}) == {}
    assert storm_kinds.batching({}) == {}


def test_a_disturbed_storm_is_measured_again_and_the_quietest_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other CPU over --max-other-cpu in the storm or either capacity run: measured again,
    capacity before included, at most --retries times; the least disturbed attempt is kept."""
    other = iter([0.30, 0.0, 0.0, 0.05, 0.0, 0.0, 0.20, 0.0, 0.0])  # storm, after, before...
    measured_capacity: list[float] = []

    def capacity(srv: object, bodies: object, seconds: float) -> dict[str, Any]:
        measured_capacity.append(seconds)
        return {"ok_per_s": 100.0, "other_cpu": next(other)}

    def one_round(*_: object) -> dict[str, Any]:
        return {"ok_per_s": 90.0, "other_cpu": next(other)}

    waits: list[float] = []
    monkeypatch.setattr(storm, "capacity", capacity)
    monkeypatch.setattr(storm, "one_round", one_round)
    monkeypatch.setattr(storm.time, "sleep", lambda s: None)
    monkeypatch.setattr(storm.cpu, "wait_quiet", waits.append)
    kind = storm_kinds.KINDS[1]
    reuse = {"ok_per_s": 100.0, "other_cpu": 0.0}
    args = parse_args(["--only", "storm", "--retries", "2", "--max-other-cpu", "0.1"])
    yardstick = {kind.bodies: 50.0}  # the open loop's, set by the kind before on these bodies
    point, after = storm.measured(object(), kind, [], reuse, yardstick, True, args, {})  # type: ignore[arg-type]
    # attempt 1, capacity before reused: storm 30%, after 0% -> again; attempt 2: before 0%,
    # storm 5%, after 0% -> kept; the rest is never read
    assert point["attempts"] == 2 and storm.disturbed(point) == pytest.approx(0.05)
    assert len(measured_capacity) == 3 and len(waits) == 1
    assert yardstick == {kind.bodies: 100.0}  # the fresh capacity before sets it again
    assert after is point["capacity_after"]
    args0 = parse_args(["--only", "storm", "--retries", "0", "--max-other-cpu", "0.1"])
    other = iter([0.30, 0.0])
    point, _ = storm.measured(object(), kind, [], reuse, {"differing": 1.0}, False, args0, {})  # type: ignore[arg-type]
    assert point["attempts"] == 1 and storm.disturbed(point) == pytest.approx(0.30)


def test_storm_body_sets_differ_and_leave_out_the_same_body() -> None:
    sets = storm_kinds.body_sets(storm.storm_input())
    assert sets["same"] == [json.dumps({"inputs": storm.storm_input()}).encode()]
    one = [json.loads(b)["inputs"] for b in sets["differing"]]
    two = [json.loads(b)["inputs"] for b in sets["differing2"]]
    assert len(set(one)) == len(one) == storm_kinds.BODY_COUNT
    assert all(isinstance(t, str) and 4 <= len(t.split()) <= 40 for t in one)
    assert all(len(pair) == 2 and pair[0] != pair[1] for pair in two)
    assert len({len(b) for b in sets["differing"]}) > 100  # lengths vary
    assert not any(t.startswith("Four score") for t in one)
    assert all(b"\n" not in b for b in sets["differing"] + sets["differing2"])  # wrk's lines


def test_storm_probe_summary_counts_failures() -> None:
    probed = [("/livez", 200, 0.002), ("/readyz", 0, 2.0), ("/metrics", 200, 0.01)]
    got = storm_kinds.probe_summary(probed)
    assert got["sent"] == 3 and got["failed"] == 1 and got["max_ms"] == pytest.approx(10.0)


def test_bench_models_are_built_once_and_load_as_the_server_would(tmp_path: Path) -> None:
    import json

    from loadtest import models
    from service.engine.loading.load import infer_task
    from service.settings import Settings

    folder = models.minilm_classifier(tmp_path / "clf")
    weights = folder / "model.safetensors"
    built = weights.stat().st_mtime_ns
    assert models.minilm_classifier(tmp_path / "clf") == folder
    assert weights.stat().st_mtime_ns == built  # the recipe matched: not built again
    assert infer_task(str(folder), Settings(model_id=str(folder))) == "text-classification"
    config = json.loads((folder / "config.json").read_text())
    assert config["id2label"] == {"0": "NEGATIVE", "1": "POSITIVE"}
    nli = json.loads((zero_shot.minilm_nli(tmp_path / "nli") / "config.json").read_text())
    assert nli["label2id"] == {"entailment": 0, "neutral": 1, "contradiction": 2}


def test_mean_pool_ignores_pad_rows() -> None:
    import torch

    from loadtest.limit import mean_pool

    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    pooled = mean_pool(hidden, torch.tensor([[1, 1, 0]]))
    assert pooled.tolist() == [[2.0, 3.0]]


def test_limit_worker_replays_a_classifier_on_short_inputs(tmp_path: Path) -> None:
    from loadtest import models
    from loadtest.limit import LimitWorker
    from loadtest.servers import REPO_ROOT

    folder = models.minilm_classifier()  # the bench's own, built once under results/
    with (tmp_path / "worker.log").open("wb") as log:
        worker = LimitWorker(16, REPO_ROOT, log, input_set="short", model_id=str(folder))
        try:
            b = worker.ask(op="b", batch_size=8)
            small = worker.ask(op="replay", shapes=[[1, 8]])["seconds"]
            large = worker.ask(op="replay", shapes=[[16, 64], [16, 64]])["seconds"]
            calls = worker.ask(op="engine_calls", text="A short input.", n=5)
        finally:
            worker.close()
    assert 0 < b["inputs_per_s"] < 100_000 and 0 < small < large
    # CPU seconds of the worker's own threads meanwhile: some, and at most its 2 cores' worth
    # of the pass's wall time (16 inputs at the measured rate)
    assert 0 < b["cpu_s"] <= 2 * 16 / b["inputs_per_s"] + 0.05
    assert len(calls["ms"]) == 5 and all(ms > 0 for ms in calls["ms"])
    assert 0 < calls["cpu_s"] <= 2 * sum(calls["ms"]) / 1000 + 0.05


def test_zero_shot_slope_and_body() -> None:
    assert zero_shot.slope([1, 2, 4, 8], [10.0, 12.0, 16.0, 24.0]) == pytest.approx(2.0)
    doc = json.loads(zero_shot.body("a text", 3))
    assert doc == {
        "inputs": "a text",
        "parameters": {"candidate_labels": ["politics", "sports", "science"]},
    }


def test_storm_goodput_is_judged_against_the_capacity_before_and_after() -> None:
    judged = storm.judge(90.0, {"ok_per_s": 80.0}, {"ok_per_s": 120.0})
    assert judged["capacity_per_s"] == 100.0
    assert judged["goodput_over_capacity"] == 0.9
    assert judged["capacity"] == {"ok_per_s": 80.0}
    assert judged["capacity_after"] == {"ok_per_s": 120.0}


def test_bulk_reads_the_batches_make_up_and_the_medians_of_rounds() -> None:
    batches = [
        {"size": 10, "bulk": 9, "inference_ms": 12.0},  # one interactive input beside 9 bulk
        {"size": 2, "bulk": 0, "inference_ms": 3.0},
        {"size": 32, "bulk": 32, "inference_ms": 40.0},
        {"size": 16, "bulk": 16, "inference_ms": 20.0},
    ]
    mix = bulk.batch_mix(batches)
    assert mix["batches"] == 4 and mix["with_interactive"] == 2 and mix["bulk_inputs"] == 57
    assert mix["bulk_beside_interactive_mean"] == 4.5 and mix["bulk_beside_interactive_max"] == 9
    assert mix["interactive_batch_ms_p50"] == 7.5 and mix["bulk_batch_ms_max"] == 40.0
    assert mix["bulk_batch_size_p50"] == 24.0

    def point(chunk: int, p99: float, **more: Any) -> dict[str, Any]:
        base = {"chunk": chunk, "p50_ms": 10.0, "p95_ms": 15.0, "p99_ms": p99, "non_200": 0}
        return {**base, "round": 1, "max_ms": p99, "batches": bulk.batch_mix(batches), **more}

    nan = float("nan")
    rounds = [
        point(0, 20.0),
        point(1000, 50.0, bulk_inputs_per_s=300.0, indexer_non_200=1),
        point(1000, nan, bulk_inputs_per_s=500.0, indexer_non_200=0, interactive=False),
        point(0, 30.0),
        point(1000, 70.0, bulk_inputs_per_s=400.0, indexer_non_200=0),
        point(1000, nan, bulk_inputs_per_s=540.0, indexer_non_200=2, interactive=False),
    ]
    s = bulk.summarize(rounds, [1000])
    assert s["alone"]["p99_ms"] == 25.0
    assert s["1000"]["p99_ms"] == 60.0 and s["1000"]["p99_ratio"] == 2.4
    assert s["1000"]["bulk_inputs_per_s"] == 350.0 and s["1000"]["bulk_alone_inputs_per_s"] == 520
    assert s["1000"]["indexer_non_200"] == 3
    assert "**2.40x** alone" in bulk.table({**_bulk_result(), "rounds": rounds, "summary": s})
    args = parse_args(["--only", "bulk", "--quick", "--bulk-chunks", "1000,2048"])
    assert args.bulk_seconds == 10.0 and args.bulk_rounds == 2 and args.bulk_chunks == [1000, 2048]


def _bulk_result() -> dict[str, Any]:
    """The head of a bulk result, as ``bulk.run`` writes it."""
    return {"model": "m", "backend": "torch", "clients": 4, "rate_per_s": 20.0, "seconds": 1.0}


def test_cost_divides_each_point_by_the_references_around_it() -> None:
    """A point's CPU and throughput ratios use the mean of the references before and after;
    the summary takes medians over rounds, and the table says which goals are met."""
    point = {**_point(ok_per_s=90.0), "tree_cpu_ms_per_input": 12.0}
    got = cost._against(
        point,
        {"inputs_per_s": 100.0, "cpu_ms_per_input": 10.0},
        {"inputs_per_s": 110.0, "cpu_ms_per_input": 14.0},
    )
    assert got["cpu_ratio"] == pytest.approx(1.0) and got["reference_cpu_ms_per_input"] == 12.0
    assert got["throughput_ratio"] == pytest.approx(90 / 105)
    assert got["reference_drift"] == pytest.approx(1.1)
    rounds = [{32: {**got, "cpu_ratio": x, "loop_ms_per_request": 0.1}} for x in (1.3, 1.1, 1.2)]
    one = {"p50_ms": 7.0, "p99_ms": 9.0, "floor_p50_ms": 1.0, "tree_cpu_ms_per_request": 9.0}
    ones = [
        {
            **one,
            "reference_p50_ms": 5.5,
            "reference_cpu_ms_per_call": 6.0,
            "cpu_ratio": 1.5,
            "p50_over_ms": 1.5,
        }
    ]
    cases = {
        "default": {"rounds": rounds, "one_client": ones},
        "torch-float32": {"rounds": [{32: {**got, "ok_per_s": 45.0}}], "one_client": ones},
    }
    summary = cost.summarize(cases)
    assert summary["default"]["cpu_ratio_at_32"] == 1.2
    assert summary["default_over_torch_float32"]["ok_per_s_at_32"] == 2.0
    text = cost.table({"inputs": 10, "cases": cases, "summary": summary})
    assert "CPU ratio 1.20 (misses <= 1.15)" in text
    assert "loop ms/request 0.10 (meets <= 0.15)" in text
    assert "call in process 1.50 (meets <= 1.5); p50 7.0 ms, over the client's floor and " in text
    assert "| default | 0 | 7.0 | 1.0 | 5.5 | 1.5 | - | 9.00 | 6.00 | 1.50 |" in text
    assert "| default | 32 | 0 | 90.0 | 0.86 | 12.00 | 12.00 | 1.30 | 0.100 |" in text


def test_batch_token_budgets_are_parsed_and_each_compared_in_its_own_round() -> None:
    assert batch_tokens.budgets("none, 2048,8192") == ["none", "2048", "8192"]
    for bad in ("0", "-5", "lots", "none,1.5"):
        with pytest.raises(ValueError, match="positive number of tokens"):
            batch_tokens.budgets(bad)

    def point(rate: float, p50: float) -> dict[str, float]:
        return {"ok_per_s": rate, "p50_ms": p50, "p99_ms": 2 * p50}

    # Round 2 ran slower for every server (drift): the ratio is taken within each round.
    result = {
        "budgets": ["none", "4096"],
        "clients": 32,
        "points": {
            "none": {"mixed": [point(100, 80), point(100, 82), point(50, 90)]},
            "4096": {"mixed": [point(110, 70), point(90, 75), point(60, 85)]},
        },
    }
    rows = batch_tokens.summary(result)["mixed"]
    assert rows["none"] == {"ok_per_s": 100, "p50_ms": 82, "p99_ms": 164, "of_base": 1.0}
    assert rows["4096"]["ok_per_s"] == 90 and rows["4096"]["p50_ms"] == 75
    assert rows["4096"]["of_base"] == pytest.approx(1.1)  # median of 1.1, 0.9, 1.2
    assert "| mixed | 4096 | 90.0 | 1.10 | 75.0 | 150.0 |" in batch_tokens.table(result)


def test_hybrid_bench_folder_is_bge_m3_and_its_table_divides_one_by_three(tmp_path: Path) -> None:
    from loadtest import models
    from service.engine.folders import is_m3

    folder = models.minilm_m3(tmp_path / "m3")
    assert is_m3(folder) and not (folder / "modules.json").exists()
    ways = {
        "one_call": {"cpu_s_per_doc": 0.05, "wall_s_per_doc": 0.03},
        "three_calls": {"cpu_s_per_doc": 0.15, "wall_s_per_doc": 0.09},
    }
    result = {
        "documents": 4,
        "tokens": {"tokens_mean": 120.0},
        "ways": ways,
        "one_over_three": {"cpu_s_per_doc": 1 / 3, "wall_s_per_doc": 1 / 3},
    }
    table = hybrid.table(result)
    assert "| one_call | 50.00 | 30.00 |" in table and "| one / three | 0.33 | 0.33 |" in table


def test_static_bench_folder_is_a_static_model_and_its_table_sets_them_side_by_side(
    tmp_path: Path,
) -> None:
    from loadtest import models
    from service.engine.static.config import is_static, read_static_config

    folder = models.minilm_static(tmp_path / "static", width=8)
    assert is_static(folder) and read_static_config(folder).normalize
    point = {"p50_ms": 2.0, "answered": 10, "errors": {}, "backend": "torch"}
    result = {
        "inputs": 500,
        "models": {
            "default": {**point, "inputs_per_s": 400.0, "cpu_ms_per_input": 4.5, "dimension": 384},
            "static": {**point, "inputs_per_s": 2000.0, "cpu_ms_per_input": 0.9, "dimension": 8},
        },
    }
    table = static.table(result)
    assert (
        "| static | StaticEmbedding, 30,522 x 256 seeded rows | 8 | 2000 | 2.0 | 0.900 |" in table
    )
    assert "| default |" in table and "| static / default | | | 5.0x | | |" in table


def test_token_pooling_agreement_counts_each_rankings_moves() -> None:
    """Kendall's tau of equal and reversed orders; the agreement of a ranking with itself, and
    with one whose best document was made the worst."""
    import numpy as np

    from loadtest.workloads import token_pooling

    assert token_pooling.kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0
    assert token_pooling.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    rng = np.random.default_rng(0)
    docs = [rng.random((5, 4), dtype=np.float32) for _ in range(4)]  # every dot product > 0
    query = rng.random((3, 4), dtype=np.float32)
    same = token_pooling.agreement([query], docs, docs, 4)
    assert same == {"top1": 1.0, "top3": 1.0, "tau": 1.0}
    best = max(range(4), key=lambda d: token_pooling.maxsim(query, docs[d]))
    moved = [d * 1e-3 if i == best else d for i, d in enumerate(docs)]
    worse = token_pooling.agreement([query], docs, moved, 4)
    assert worse["top1"] == 0.0 and worse["tau"] < 1.0


def test_late_chunking_documents_cosines_and_table() -> None:
    """Documents are runs of whole corpus sentences; the cosines on known vectors; the table
    divides late by first and prints each way's figures."""
    import numpy as np

    from loadtest.workloads import late_chunking as lc

    docs = lc.documents(6)
    assert docs == lc.documents(6) and all(len(d) >= 2 for d in docs)
    sentences = corpus.sentences()
    assert all(chunk in sentences for d in docs for chunk in d)
    assert all(sum(len(c.split()) for c in d) <= lc.DOCUMENT_WORDS[1] for d in docs)
    # rows (1, 0), (0, 1), (1, 1): cosines 0, 1/sqrt(2), 1/sqrt(2) -> mean sqrt(2)/3
    three = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    assert lc.mean_pairwise_cosine(three) == pytest.approx(2**0.5 / 3)
    assert lc.mean_row_cosine(three, three * 5) == pytest.approx(1.0)
    assert lc.mean_row_cosine(three[:2], three[1::-1]) == pytest.approx(0.0)

    class Tok:
        def __call__(self, texts: list[str]) -> dict[str, list[list[int]]]:
            return {"input_ids": [[0] * len(t.split()) for t in texts]}

    pair = [["a b", "c d e"], ["f g h", "i"]]  # 5 and 4 "tokens"
    same = [np.eye(2), np.array([[1.0, 0.0], [1.0, 1.0]])]  # chunk cosines 0 and 0.707
    result = lc.summarize(
        pair,
        {"late_chunking": [0.2, 0.4], "chunking_first": [0.8, 0.5]},
        {"late_chunking": same[1:] * 2, "chunking_first": same},
        2,
        Tok(),
        {"max_input_tokens": 4},
    )
    late, first = result["ways"]["late_chunking"], result["ways"]["chunking_first"]
    assert late["cpu_s_per_doc"] == pytest.approx(0.05) and first["wall_s_per_doc"] == 0.125
    assert late["chunk_cosine"] == pytest.approx(2**-0.5)
    assert first["chunk_cosine"] == pytest.approx(2**-0.5 / 2)
    assert first["requests_per_doc"] == 2.0 and result["over_one_window"] == 1
    assert result["late_over_first"]["cpu_s_per_doc"] == pytest.approx(0.25)
    assert result["late_vs_alone_cosine"] == pytest.approx((1 + (1 + 2**-0.5) / 2) / 2)
    table = lc.table(result)
    assert "| late chunking | 1.0 | 50.00 | 100.00 | 0.707 |" in table
    assert "| chunking first | 2.0 | 200.00 | 125.00 | 0.354 |" in table
    assert "| late / first | - | 0.25 | 0.80 | - |" in table
