"""The load-test helpers without a server: corpus, outcomes, shapes, the gate, the report."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from loadtest import client, corpus, gate, outcomes, report, shapes
from loadtest.stats import percentile


def test_corpus_inputs_are_deterministic_and_mixed_in_length() -> None:
    first, again = corpus.mixed_inputs(300, seed=3), corpus.mixed_inputs(300, seed=3)
    assert first == again
    words = sorted(len(text.split()) for text in first)
    assert words[0] <= 10 and words[-1] >= 150 and words[-1] <= corpus.MAX_WORDS
    assert words[len(words) // 2] < 60  # mostly short, as traffic is


def test_short_draws_are_short() -> None:
    rng = random.Random(0)
    short = (corpus.LengthClass("short", 1.0, 4, 25),)
    assert all(len(corpus.draw(rng, short).split()) <= 25 for _ in range(200))


def test_every_input_fits_the_embedded_model(embedded_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_model))
    longest = max(len(ids) for ids in tok(corpus.mixed_inputs(512))["input_ids"])
    assert longest <= 450  # the model takes 512; keep a margin for other tokenizers


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b"[[0.1]]", None),
        (200, b"oops", "error (200 without a JSON list)"),
        (503, b"{}", "shed (503)"),
        (504, b"{}", "expired (504)"),
        (413, b"{}", "rejected (413)"),
        (500, b"{}", "error (500)"),
        (0, b"", "error (connection)"),
    ],
)
def test_failure_names(status: int, body: bytes, expected: str | None) -> None:
    assert outcomes.failure_name(status, body) == expected
    if expected:
        assert outcomes.category_of(f"CatchResponseError({expected!r})") == expected.split()[0]


def test_unknown_errors_count_as_errors() -> None:
    assert outcomes.category_of("ConnectionRefusedError(111, 'refused')") == "error"


@pytest.mark.parametrize(
    ("header", "delay"), [("2", 2.0), ("0.5", 0.5), (None, 1.0), ("soon", 1.0), ("99", 30.0)]
)
def test_retry_after_is_honoured_within_a_cap(header: str | None, delay: float) -> None:
    assert outcomes.retry_delay(header, cap_s=30.0) == delay


def test_shapes() -> None:
    assert [shapes.users_at("step", t, 40, 64) for t in (0, 9.9, 10, 25, 39)] == [
        16,
        16,
        32,
        48,
        64,
    ]
    assert shapes.users_at("steady", 5, 10, 8) == 8
    burst = [
        shapes.users_at("burst", t, 60, 40, burst_every_s=20, burst_length_s=5) for t in (1, 16)
    ]
    assert burst == [10, 40]
    assert shapes.users_at("step", 40, 40, 64) is None
    with pytest.raises(ValueError, match="unknown shape"):
        shapes.users_at("ramp", 0, 10, 1)


def test_gate_fails_each_crossed_threshold() -> None:
    run = gate.RunSummary(100, 250.0, {"shed": 10, "error": 1})
    limits = gate.Thresholds(max_error_rate=0.0, max_shed_rate=0.05, max_p95_ms=200)
    failed = [line for ok, line in gate.evaluate(run, limits) if not ok]
    assert [line.split()[0] for line in failed] == ["shed", "error", "p95"]
    lenient = gate.Thresholds(max_error_rate=0.02, max_shed_rate=0.2, max_p95_ms=300)
    assert all(ok for ok, _ in gate.evaluate(run, lenient))


def test_gate_cli_reads_locust_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "run"
    (tmp_path / "run_stats.csv").write_text(
        "Type,Name,Request Count,Failure Count,95%\n"
        "POST,POST / json,40,4,180\n,Aggregated,40,4,180\n"
    )
    (tmp_path / "run_failures.csv").write_text(
        "Method,Name,Error,Occurrences\nPOST,POST / json,\"CatchResponseError('shed (503)')\",4\n"
    )
    assert gate.read_csv(prefix) == gate.RunSummary(
        40, 180.0, {"shed": 4, "expired": 0, "rejected": 0, "error": 0}
    )
    assert gate.main([str(prefix), "--max-shed-rate", "0.2", "--max-p95-ms", "200"]) == 0
    assert gate.main([str(prefix), "--max-shed-rate", "0.05"]) == 1
    assert "SLO FAIL: shed rate 0.1000" in capsys.readouterr().out


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 99))


def _closed(scale: float) -> dict[int, dict[str, Any]]:
    return {
        n: {
            "inputs_per_s": scale * n / (n + 1),
            "p50_ms": 10.0 * n,
            "p95_ms": 20.0 * n,
            "p99_ms": 30.0 * n,
            "requests": 100,
            "requests_per_s": scale,
            "statuses": {200: 100},
        }
        for n in (1, 4, 16)
    }


def _result() -> dict[str, Any]:
    run = {
        "goodput_per_s": 90.0,
        "shed_rate": 0.5,
        "p99_ms": 800.0,
        "shed_p50_ms": 3.0,
        "shed_p99_ms": 9.0,
        "requests": 400,
        "statuses": {200: 200, 503: 200},
        "dropped": 0,
    }
    probe = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}
    return {
        "limit": {
            "inputs": 64,
            "tokens": {"mean": 90.0, "max": 300},
            "torch_threads": 2,
            "model": "/x/model",
            "pipeline_batches": {1: 100.0, 8: 120.0},
            "model_sorted_batches": {1: 110.0, 8: 180.0},
            "limit_a": 120.0,
            "limit_a_batch_size": 8,
            "limit_b": 180.0,
            "limit_b_batch_size": 8,
            "single_call_ms": {"p50": 8.0, "p99": 30.0},
        },
        "server": {
            "closed": _closed(110.0),
            "floor": _closed(5000.0),
            "overload": {
                "capacity_per_s": 100.0,
                "deadline_s": 2.0,
                "floor": probe,
                "runs": {1.0: run, 4.0: run},
            },
        },
        "baseline": {"closed": _closed(60.0)},
        "machine": {"cpus": 2},
    }


def test_report_ratios_table_and_plot(tmp_path: Path) -> None:
    from loadtest.plot import plot

    result = _result()
    result["ratios"] = ratios = report.ratios(result)
    assert ratios["server_peak_over_limit_a"] == pytest.approx(110 * 16 / 17 / 120)
    assert ratios["server_peak_over_baseline_peak"] == pytest.approx(110 / 60)
    assert ratios["overload_top_goodput_over_capacity"] == pytest.approx(0.9)
    text = report.table(result)
    assert "| pipeline-server | 16 |" in text and "| 4x | 90.0 | 50.0% |" in text
    plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")


def test_paired_ratios_are_medians_of_points_between_their_limits() -> None:
    result = _result()
    points = [(40.0, 36.0, 50.0), (45.0, 38.0, 35.0), (44.0, 40.0, 46.0)]  # before, server, after
    result["server"]["paired"] = {
        "batch_size": 16,
        "levels": {
            64: [
                {
                    "round": i,
                    "limit_b_before": b,
                    "inputs_per_s": s,
                    "limit_b_after": a,
                    "ratio": s / ((b + a) / 2),
                    "alone_inputs_per_s": alone,
                    "forward_slowdown": slow,
                    "busy": 0.97,
                }
                for i, ((b, s, a), alone, slow) in enumerate(
                    zip(points, (42.0, 43.0, 46.0), (1.2, 1.1, 1.3), strict=True), 1
                )
            ]
        },
        "one_client": [{"round": 1, "p50_ms": 30.0, "single_p50_ms": 25.0, "n": 100}],
        "median_ratio": {64: 40.0 / 45.0},
        "one_client_p50_ms": 30.0,
        "single_call_p50_ms": 25.0,
    }
    result["ratios"] = ratios = report.ratios(result)
    assert ratios["paired_server_over_limit_b_at_64_clients"] == pytest.approx(0.8889, abs=1e-4)
    assert ratios["paired_p50_one_client_target_ms"] == pytest.approx(29.5)
    # batches alone over the mean of their limits: 42/45, 43/40, 46/45 -> median 46/45
    assert ratios["paired_batches_alone_over_limit_b_at_64_clients"] == pytest.approx(46 / 45)
    assert ratios["paired_forward_slowdown_at_64_clients"] == pytest.approx(1.2)
    text = report.table(result)
    assert "| 2 | 64 clients | 45.0 | 38.0 | 35.0 | 0.95 | 43.0 | 1.10x | 97% |" in text
    assert "| 1 | 1 client, p50 ms | direct call 25.0 | 30.0 | | 1.02 of target |" in text


def test_paired_rounds_put_each_server_point_between_two_limit_points() -> None:
    from loadtest.split import paired_rounds

    limits = iter([(100.0, 0.0), (120.0, 0.05), (80.0, 0.0), (90.0, 0.0), (110.0, 0.2), (70.0, 0)])
    served = iter([55.0, 75.0, 50.0, 60.0])
    asked: list[int] = []

    async def one_client() -> dict[str, float]:
        return {"p50_ms": 12.0, "single_p50_ms": 10.0}

    async def point(n: int) -> dict[str, Any]:
        asked.append(n)
        return {"inputs_per_s": next(served), "requests": 7}

    points, ones = client.run(paired_rounds(2, [8, 32], lambda: next(limits), one_client, point))
    assert asked == [8, 32, 8, 32] and [one["round"] for one in ones] == [1, 2]
    assert [p["round"] for p in points[8]] == [1, 2] == [p["round"] for p in points[32]]
    # round 1: limit 100, point 55, limit 120, point 75, limit 80; round 2 starts afresh at 90
    first, second, third = points[8][0], points[32][0], points[8][1]
    assert (first["limit_b_before"], first["limit_b_after"]) == (100.0, 120.0)
    assert first["ratio"] == pytest.approx(55 / 110) and first["limit_other_cpu"] == 0.05
    assert second["limit_b_before"] == 120.0 and second["ratio"] == pytest.approx(75 / 100)
    assert third["limit_b_before"] == 90.0 and third["ratio"] == pytest.approx(50 / 100)
    assert third["limit_other_cpu"] == 0.2 and third["requests"] == 7
    assert points[32][1]["ratio"] == pytest.approx(60 / 90) and math.isnan(first["over_alone"])


def test_batches_alone_reads_the_points_batch_lines(tmp_path: Path) -> None:
    from loadtest.split import batches_alone

    def line(ts: str, size: int, tokens: int, padded: int, ms: float) -> str:
        return json.dumps(
            {
                "event": "batch",
                "timestamp": f"2026-01-01T00:00:{ts}Z",
                "size": size,
                "tokens": tokens,
                "padded_tokens": padded,
                "inference_ms": ms,
            }
        )

    log = tmp_path / "server.log"
    earlier = line("00.0", 9, 90, 90, 999.0) + "\n"
    log.write_text(
        earlier
        + "not json\n"
        + line("01.0", 4, 300, 400, 500.0)
        + "\n"
        + json.dumps({"event": "request", "latency_ms": 3})
        + "\n"
        + line("02.0", 2, 100, 120, 500.0)
        + "\n"
        + '{"event": "batch", "size'  # a line still being written
    )
    asked: list[dict[str, object]] = []

    class Worker:
        def ask(self, **req: object) -> dict[str, float]:
            asked.append(req)
            return {"seconds": 0.8}

    split = batches_alone(log, len(earlier), Worker())  # type: ignore[arg-type]
    assert asked == [{"op": "replay", "shapes": [[4, 100], [2, 60]]}]
    assert split["batches"] == 2 and split["batch_inputs"] == 6
    assert split["alone_inputs_per_s"] == pytest.approx(6 / 0.8)
    assert split["forward_slowdown"] == pytest.approx(1.0 / 0.8)
    assert split["busy"] == pytest.approx(1.0 / 1.5)  # 1 s apart, plus the first batch's 0.5 s
    assert split["padding_efficiency"] == pytest.approx(400 / 520)


def test_disturbed_points_are_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadtest import cpu

    shares = iter([0.5, 0.3, 0.05, 0.9])
    waits: list[float] = []
    monkeypatch.setattr(cpu, "foreign_share", lambda before, after: next(shares))
    monkeypatch.setattr(cpu, "wait_quiet", waits.append)
    results = iter(["first", "second", "third"])
    quiet = cpu.Quiet(max_other_cpu=0.1, retries=2, wait_s=7)
    assert cpu.least_disturbed(lambda: next(results), quiet) == ("third", 0.05, 3)
    assert waits == [7, 7]
    results = iter(["only"])
    never = cpu.Quiet(max_other_cpu=0.1, retries=0)
    assert cpu.least_disturbed(lambda: next(results), never) == ("only", 0.9, 1)


def test_spread_orders_batches_so_prefixes_span_the_range() -> None:
    from loadtest.limit import spread

    assert spread(10) == [0, 8, 4, 2, 6, 1, 9, 5, 3, 7]
    assert sorted(spread(13)) == list(range(13)) and spread(1) == [0]
    assert {i // 4 for i in spread(16)[:4]} == {0, 1, 2, 3}  # 4 first picks: one per quarter


def test_limit_worker_answers_in_turn_and_exits(embedded_model: Path, tmp_path: Path) -> None:
    from loadtest.limit import LimitWorker
    from loadtest.servers import REPO_ROOT

    with (tmp_path / "worker.log").open("wb") as log:
        worker = LimitWorker(8, REPO_ROOT, log)
        try:
            passes = [worker.ask(op="b", batch_size=4)["inputs_per_s"] for _ in range(2)]
            calls = worker.ask(op="calls", indices=[3, 1, 3])["ms"]
            small = worker.ask(op="replay", shapes=[[1, 8]])["seconds"]
            large = worker.ask(op="replay", shapes=[[16, 128], [16, 128]])["seconds"]
            pooled = worker.ask(op="b", batch_size=4, pooling="mean")["inputs_per_s"]
            backend = worker.ask(op="backend")  # (b)'s forward: the server's (tests/conftest.py)
        finally:
            worker.close()
    assert (backend["name"], backend["dtype"]) == ("torch", "float32")
    assert all(0 < rate < 10_000 for rate in [*passes, pooled])
    assert len(calls) == 3 and all(0 < ms < 10_000 for ms in calls)
    assert 0 < small < large  # 8 tokens once against 2 x 16 x 128 padded tokens
    assert worker.proc.returncode == 0


def test_free_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    import socket

    from loadtest import servers

    low, _ = servers._ephemeral_range()
    ports = [servers.free_port() for _ in range(200)]
    assert len(set(ports)) == 200  # bind(0) alone repeats one in about 1,000 draws of six
    assert all(10_000 <= p < low for p in ports)
    with socket.socket() as sock:
        sock.bind((servers.HOST, ports[-1]))  # free: a server can bind it


def test_a_server_that_exits_before_ready_is_reported_with_its_log(tmp_path: Path) -> None:
    import subprocess
    import sys

    from loadtest.servers import free_port, wait_ready

    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('Connection in use'); sys.exit(1)"],
            stdout=sink,
        )
    proc.wait(30)
    with pytest.raises(RuntimeError, match=r"exited with code 1 before ready.*\nConnection in use"):
        wait_ready(f"http://127.0.0.1:{free_port()}/readyz", 5, proc, log)
