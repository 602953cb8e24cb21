"""Bounded runs of the workloads and studies against the real server (each under about 30 s):
they start, measure, and return the figures their tables print. Not a measurement."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from loadtest.bench import parse_args
from loadtest.experiments import burst, memory, pooled, zero_shot
from loadtest.experiments.bench import WORKLOADS as STUDIES
from loadtest.workloads import hybrid, retrieval, storm

pytestmark = [
    pytest.mark.loadtest,
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk: apt-get install wrk"),
]


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    study = extra[extra.index("--only") + 1] in STUDIES
    argv = ["--quick", "--retries", "0", "--results", str(tmp_path), *extra]
    return parse_args(argv, STUDIES) if study else parse_args(argv)


def test_burst_sheds_and_probes(tmp_path: Path) -> None:
    res = burst.run(_args(tmp_path, "--only", "burst", "--burst-count", "1"))
    assert res["floor_n"] == burst.SIZE and res["livez_n"] == burst.PROBES
    assert res["shed_n"] > burst.SIZE // 2  # queue of 8: nearly all of them
    assert res["shed"]["p50_ms"] > 0 and "| sheds (503) in the burst |" in burst.table(res)


def test_storm_counts_goodput_and_sheds(tmp_path: Path) -> None:
    extra = ["--storm-seconds", "2", "--storm-kinds", "differing,open4x"]
    res = storm.run(_args(tmp_path, "--only", "storm", *extra))
    assert [r["kind"] for r in res["rounds"]] == ["differing", "open4x"]
    for rnd in res["rounds"]:
        assert rnd["capacity_per_s"] > 0 and rnd["shed_per_s"] > 0 and rnd["alive"]
        assert rnd["statuses"] and set(rnd["polite"]["statuses"]) <= {200, 503, 504}
        assert rnd["probes"]["sent"] > 5 and rnd["probes"]["failed"] == 0
        assert rnd["acted"]["sheds"] > 0 and "loop_ms_per_request" in rnd
        # the load side's CPU: wrk (a waited child) or the open loop in this process
        assert rnd["client_cores"] > 0 and rnd["capacity"]["client_cores"] > 0
        # what the model did, storm and capacity run alike: batches answered 200s' inputs
        for window, answered in (
            (rnd, rnd["statuses"]),
            (rnd["capacity"], rnd["capacity"]["statuses"]),
        ):
            b = window["batching"]
            assert 1 <= b["mean_batch"] <= 64 and b["pipeline_ms_per_input"] > 0
            assert b["padded_tokens_per_input"] >= 4  # [CLS], [SEP] and 4-40 words
            assert answered.get(200, 0) > 0


def test_memory_samples_rss(tmp_path: Path) -> None:
    args = _args(tmp_path, "--only", "memory", "--minutes", "0.1", "--memory-interval", "2")
    args.memory_phases = ["storm"]
    res = memory.run(args)
    phase = res["phases"]["storm"]
    assert len(phase["series"]) >= 3 and phase["rss_end_mb"] > 100


def test_zero_shot_measures_each_label_count(tmp_path: Path) -> None:
    extra = ["--zero-shot-labels", "1,4", "--zero-shot-one-client", "4", "--zero-shot-seconds", "1"]
    res = zero_shot.run(_args(tmp_path, "--only", "zero_shot", *extra))
    assert res["task"] == "zero-shot-classification" and set(res["points"]) == {1, 4}
    for k, point in res["points"].items():
        assert point["one_client_p50_ms"] > 0 and point["direct_p50_ms"] > 0
        assert point["load"]["statuses"] == {} or set(point["load"]["statuses"]) == {200}
        assert point["load"]["pairs_per_s"] == pytest.approx(point["load"]["ok_per_s"] * k)
    assert "| 4 |" in zero_shot.table(res)


def test_pooled_answers_beside_token_rows(tmp_path: Path) -> None:
    extra = ["--pooled-inputs", "16", "--pooled-levels", "1,4", "--pooled-seconds", "2"]
    res = pooled.run(_args(tmp_path, "--only", "pooled", *extra))
    for answer in ("token rows", "pooled"):
        points = res["answers"][answer]
        assert set(points) == {1, 4} and all(set(p["statuses"]) <= {200} for p in points.values())
        assert sum(p["requests"] for p in points.values()) > 0  # answered within the windows
    assert "| 4 |" in pooled.table(res)


def test_retrieval_weighs_answers_and_chunks_the_long_document(tmp_path: Path) -> None:
    extra = ["--retrieval-parts", "embeddings,long", "--retrieval-levels", "2"]
    extra += [
        "--retrieval-seconds",
        "1",
        "--retrieval-inputs",
        "4",
        "--retrieval-bytes-inputs",
        "4",
    ]
    res = retrieval.run(
        _args(tmp_path, "--only", "retrieval", *extra, "--retrieval-long-repeats", "1")
    )
    pooled, multi = res["embeddings"]["pooled"], res["embeddings"]["multi-vector"]
    for input_type in ("query", "document"):
        # no skiplist, no expansion: a vector per token, [CLS] and [SEP] included
        tokens = res["inputs"][input_type]["tokens_mean"]
        assert multi[input_type]["vectors_per_input"] == tokens
        assert pooled[input_type]["vectors_per_input"] == 1
        # JSON: about the same bytes a float, so the answers weigh as their floats
        floats = tokens * 128 / 384
        got, one = multi[input_type]["bytes_per_answer"], pooled[input_type]["bytes_per_answer"]
        assert got == pytest.approx(one * floats, rel=0.2)
        assert set(multi[input_type]["levels"]) == {2}
    assert multi["dimension"] == 128 and pooled["dimension"] == 384
    long = res["long"]
    assert long["limit"] == 256 and long["tokens"] >= 2000
    windows = -(-(long["tokens"] - 2) // 254)  # the text's tokens in windows of 256 - 2
    assert long["modes"]["chunk"]["pipeline_inputs"] == windows == 8
    assert long["modes"]["truncate"]["pipeline_inputs"] == 1
    assert long["modes"]["chunk"]["server_ms"] > 0 and 0.3 < long["cosine"] < 0.99
    assert "| chunk |" in retrieval.table(res)


def test_hybrid_compares_one_call_with_three(tmp_path: Path) -> None:
    extra = ["--hybrid-documents", "2", "--hybrid-rounds", "1"]
    res = hybrid.run(_args(tmp_path, "--only", "hybrid", *extra))
    assert res["documents"] == 2 and res["hybrid"]["multi_vector"] == 384
    assert all(w["cpu_s_per_doc"] > 0 and w["wall_s_per_doc"] > 0 for w in res["ways"].values())
    assert "| one / three |" in hybrid.table(res)
