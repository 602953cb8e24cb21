"""A bounded Locust smoke run against the real server, and the SLO gate failing and passing.

The server runs from the ``pipeline-server`` console script on a free loopback port with the
embedded model, a queue of 8 inputs and batches of 2, so that 32 greedy users (JSON lists of
up to 8 inputs) are shed: the run shows 503s counted as "shed", never as errors. Locust runs 6
seconds; then `make locust` runs twice for 3 seconds (its sheds fail its gate).
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtest import gate, servers

pytestmark = pytest.mark.loadtest

LOCUSTFILE = servers.REPO_ROOT / "loadtest" / "locustfile.py"


@dataclass(frozen=True)
class LocustRun:
    prefix: Path
    returncode: int
    output: str


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    env = {
        **os.environ,
        "MAX_QUEUE_SIZE": "8",
        "MAX_CLIENT_BATCH_SIZE": "8",
        # Batches of 2 inputs at most: 16 users overflow the queue well past the gate's 5%
        # shed rate (11-14% in a 3 s step-up; at MAX_BATCH_SIZE 32 it came as low as 4.9%).
        "MAX_BATCH_SIZE": "2",
        "LOG_LEVEL": "warning",
    }
    port = servers.free_port()
    command = servers.pipeline_server_command()
    with servers.started(command, port, env, ready_timeout_s=120) as (url, _):
        yield url


@pytest.fixture(scope="module")
def locust_run(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> LocustRun:
    """One 6-second headless run whose in-Locust gate asks for an impossible p95."""
    prefix = tmp_path_factory.mktemp("locust") / "smoke"
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--host",
        base_url,
        "--headless",
        "-u",
        "32",
        "-r",
        "32",
        "-t",
        "6s",
        "--think-max-ms",
        "0",
        "--csv",
        str(prefix),
        "--html",
        f"{prefix}.html",
        "--only-summary",
        "--slo-max-p95-ms",
        "0.001",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=servers.REPO_ROOT)
    return LocustRun(prefix, done.returncode, done.stdout + done.stderr)


def test_locust_writes_reports_and_counts_sheds_by_name(locust_run: LocustRun) -> None:
    with open(f"{locust_run.prefix}_stats.csv", newline="") as fh:
        rows = {row["Name"]: row for row in csv.DictReader(fh)}
    assert int(rows["Aggregated"]["Request Count"]) > 0, locust_run.output
    assert {"POST / raw short", "POST / json", "POST / json list"} <= rows.keys()
    summary = gate.read_csv(locust_run.prefix)
    assert summary.failures["shed"] > 0, locust_run.output
    assert summary.failures["error"] == summary.failures["rejected"] == 0, locust_run.output
    assert Path(f"{locust_run.prefix}.html").stat().st_size > 0


def test_locust_exit_code_follows_the_gate(locust_run: LocustRun) -> None:
    assert locust_run.returncode == 1, locust_run.output
    assert "SLO FAIL: p95" in locust_run.output
    assert "SLO PASS: error rate 0.0000" in locust_run.output


def test_locust_prints_a_short_summary(locust_run: LocustRun) -> None:
    lines = locust_run.output.splitlines()
    requests = next(line for line in lines if line.startswith("requests: "))
    assert re.fullmatch(r"requests: [1-9]\d*, \d+\.\d req/s", requests), requests
    assert re.search(
        r"^failures: [1-9]\d* \(shed [1-9]\d*, expired 0, rejected 0, error 0\)$",
        locust_run.output,
        re.MULTILINE,
    ), locust_run.output
    assert re.search(r"^latency: p50 \d+ ms, p95 \d+ ms", locust_run.output, re.MULTILINE)


def test_make_locust_prints_a_summary_keeps_runs_apart_and_fails_with_the_gate(
    base_url: str, tmp_path: Path
) -> None:
    """Against the shedding server the gate fails (shed rate over 5%): make exits non-zero.
    The console shows the summary only; each run has its own folder, Locust's tables in its
    log. (`-o`: make must not rebuild the virtualenv from a test.)"""
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [
                "make",
                "-o",
                ".venv/.dev",
                "-o",
                ".venv/.installed",
                "locust",
                f"HOST_URL={base_url}",
                "LOCUST_TIME=3s",
                f"LOCUST_RESULTS={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=servers.REPO_ROOT,
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0, output
        assert "SLO FAIL: shed rate" in output and "SLO gate: FAILED" in output, output
        assert len(done.stdout.splitlines()) <= 12, output
        assert "Aggregated" not in output, "Locust's tables belong in the run's log"
        runs.append(output)
    folders = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 2, runs
    for folder in folders:
        assert f"files in {folder}/" in "".join(runs)
        assert gate.read_csv(folder / "step").requests > 0
        assert "Aggregated" in (folder / "locust.log").read_text()
        assert (folder / "step.html").stat().st_size > 0


def test_gate_cli_fails_on_impossible_and_passes_on_lenient(locust_run: LocustRun) -> None:
    def gate_cli(*limits: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "loadtest.gate", str(locust_run.prefix), *limits]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=30, cwd=servers.REPO_ROOT
        )

    impossible = gate_cli("--max-p95-ms", "0.001", "--max-shed-rate", "0")
    assert impossible.returncode == 1
    assert "SLO FAIL: shed rate" in impossible.stdout and "SLO FAIL: p95" in impossible.stdout
    lenient = gate_cli("--max-p95-ms", "600000", "--max-shed-rate", "1", "--max-expired-rate", "1")
    assert lenient.returncode == 0, lenient.stdout
    assert lenient.stdout.rstrip().endswith("SLO gate: passed")
