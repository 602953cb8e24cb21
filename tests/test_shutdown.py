"""Graceful shutdown of the real server (DESIGN.md's Shutdown): C14, and SIGTERM under
load losing nothing.

"Nothing lost" is checked against the server's own record: every request the app received is
logged once with its request id and status, so each id in the log must have reached the client
as a full answer with that status. A request the client could not deliver (the listener closed,
or an idle keep-alive connection closed under it) never reached the app: it is not in the log.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import load
import pytest
from helpers import ServerProcess

from service import settings as settings_module

LONG = " ".join(["paris is the capital of france"] * 80)  # about 480 tokens
# Transport errors a request may meet once the server stops listening; the request never
# reached the app (checked against the log).
NOT_DELIVERED = ("ClientConnectorError", "ServerDisconnectedError", "ClientOSError")


def _logged_requests(server: ServerProcess) -> dict[str, int]:
    lines = [json.loads(x) for x in server.log().splitlines() if x.startswith("{")]
    return {x["request_id"]: x["status"] for x in lines if x.get("event") == "request"}


def _wait_depth(server: ServerProcess, at_least: int, timeout: float = 10) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if load.value(load.scrape(server.url), "pipeline_server_queue_depth") >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError(f"queue depth never reached {at_least}")


def _readiness_after_sigterm(server: ServerProcess, seconds: float) -> list[int]:
    """GET /readyz on a new connection every 20 ms: status, or 0 when refused."""
    seen = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            seen.append(httpx.get(server.url + "/readyz", timeout=2).status_code)
        except httpx.TransportError:
            seen.append(0)
        time.sleep(0.02)
    return seen


@pytest.mark.server
def test_c14_in_flight_requests_finish_after_sigterm(
    start_server: Callable[..., ServerProcess], tiny_models: dict[str, Path]
) -> None:
    """5 slow requests in flight, SIGTERM, 3 more: the 5 answer 200 in full, readiness turns
    503 (or refused) at once and never back, the 3 get 503 with Retry-After or a refused
    connection, and gunicorn exits 0 well within its graceful timeout."""
    server = start_server(
        MODEL_ID=str(tiny_models["text-classification"]),
        MAX_BATCH_SIZE="1",
        TORCH_NUM_THREADS="1",
        DRAIN_TIMEOUT_S="20",
    )
    server.wait_ready()

    async def scenario() -> tuple[list[load.Outcome], list[int], list[load.Outcome], float]:
        async with load.session() as client:
            slow = [
                asyncio.create_task(
                    load.post(client, server.url + "/", json={"inputs": [LONG] * 32})
                )
                for _ in range(5)
            ]
            await asyncio.to_thread(_wait_depth, server, 4 * 32)  # all five admitted
            server.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            readiness = await asyncio.to_thread(_readiness_after_sigterm, server, 0.5)
            async with load.session() as late_client:
                late = [load.post(late_client, server.url + "/", data="late") for _ in range(3)]
                late_outcomes = list(await asyncio.gather(*late))
            return list(await asyncio.gather(*slow)), readiness, late_outcomes, sent

    slow, readiness, late, sigterm_at = asyncio.run(asyncio.wait_for(scenario(), 60))
    code = server.proc.wait(30)
    exited_after = time.monotonic() - sigterm_at
    assert code == 0
    assert exited_after < 20 + 5  # DRAIN_TIMEOUT_S + gunicorn's margin: it finished, not killed
    for outcome in slow:
        assert outcome.error is None and outcome.status == 200, outcome
        assert len(outcome.body) == 32
    # The worker hears SIGTERM a moment after gunicorn: a 200 may come first, never after.
    first_down = next(i for i, s in enumerate(readiness) if s != 200)
    assert first_down <= 5 and set(readiness[first_down:]) <= {503, 0}, readiness
    for outcome in late:
        if outcome.error is None:
            assert outcome.status == 503 and int(outcome.headers["retry-after"]) >= 1
            assert outcome.body["error_type"] == "draining"
        else:
            assert outcome.error.startswith("ClientConnectorError"), outcome.error  # refused
    log = server.log()
    assert "draining" in log and "WORKER TIMEOUT" not in log
    assert log.count("Booting worker") == 1


@pytest.mark.server
def test_sigterm_under_load_loses_nothing(
    start_server: Callable[..., ServerProcess], tiny_models: dict[str, Path]
) -> None:
    """Clients keep sending through SIGTERM until refused; more work is queued than the 0.25 s
    drain can finish (with a 1 s drain a fast machine answered 30-34 requests of 8 inputs in
    all, once the whole queue, and the drain cut nothing). Every request the app received is
    answered in full (200 done in time, 503 with Retry-After for what the drain could not
    finish or what came after SIGTERM); the process exits 0 a few seconds after DRAIN_TIMEOUT_S
    at most."""
    drain_s = 0.25
    server = start_server(
        MODEL_ID=str(tiny_models["text-classification"]),
        MAX_BATCH_SIZE="4",
        MAX_QUEUE_SIZE="256",
        MAX_CLIENT_BATCH_SIZE="32",
        TORCH_NUM_THREADS="1",
        DRAIN_TIMEOUT_S=str(drain_s),
    )
    server.wait_ready()
    outcomes: list[load.Outcome] = []

    async def client_loop(c: int, stop_at: float) -> None:
        async with load.session(timeout_s=30) as client:
            for n in range(200):  # bounded in count and (stop_at) in time
                outcome = await load.post(
                    client,
                    server.url + "/",
                    request_id=f"c{c}-{n}",
                    json={"inputs": [f"{c} {n} {LONG}"] * 8},
                )
                outcomes.append(outcome)
                if outcome.error or time.monotonic() > stop_at:
                    return
                if outcome.status == 503:
                    await asyncio.sleep(0.05)

    async def scenario() -> float:
        stop_at = time.monotonic() + 15
        clients = [asyncio.create_task(client_loop(c, stop_at)) for c in range(40)]
        await asyncio.to_thread(_wait_depth, server, 200)  # the queue is full of work
        for _ in range(200):  # and work is being answered (bounded: 10 s on a slow machine)
            if any(o.status == 200 for o in outcomes):
                break
            await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await asyncio.gather(*clients)
        return sent

    sigterm_at = asyncio.run(asyncio.wait_for(scenario(), 60))
    code = server.proc.wait(30)
    assert code == 0
    assert time.monotonic() - sigterm_at < drain_s + 5

    logged = _logged_requests(server)
    by_id = {o.request_id: o for o in outcomes}
    for request_id, status in logged.items():
        if not request_id.startswith("c"):
            continue
        outcome = by_id[request_id]
        assert outcome.error is None, (request_id, status, outcome.error)  # nothing dropped
        assert outcome.status == status
    statuses = Counter(o.status for o in outcomes if o.error is None)
    assert set(statuses) <= {200, 503, 504}, statuses
    for outcome in outcomes:
        if outcome.error is not None:
            assert outcome.error.startswith(NOT_DELIVERED), outcome.error
            assert outcome.request_id not in logged
        elif outcome.status == 200:
            assert len(outcome.body) == 8
        elif outcome.status == 503:
            assert int(outcome.headers["retry-after"]) >= 1
    drained = [o for o in outcomes if o.status == 503 and o.body["error_type"] == "draining"]
    assert drained, statuses  # the drain limit cut the queue: answered 503, not dropped
    assert statuses[200] > 0


@pytest.mark.parametrize("drain", ["0", "0.5", "7.5", "25", "120"])
def test_gunicorn_waits_longer_than_the_drain(monkeypatch: pytest.MonkeyPatch, drain: str) -> None:
    """gunicorn's graceful timeout covers DRAIN_TIMEOUT_S plus the last batch and the exit, so
    it never kills a worker that is still answering what it accepted."""
    monkeypatch.setenv("DRAIN_TIMEOUT_S", drain)
    monkeypatch.setattr(settings_module._Process, "settings", None)  # a fresh process's
    conf = importlib.reload(importlib.import_module("service.gunicorn_conf"))
    assert conf.graceful_timeout >= float(drain) + 3
    assert conf.timeout == 30  # the default worker timeout stays (C17: the load is off the loop)
