"""Shedding from the request head: a shed is decided before the body is read,
a connection that retries before its Retry-After is held until then, and a first shed or a
polite retry is answered at once.

In-process server (uvicorn with the HTTP edge, a tiny classifier) whose batches are held by a
gate, so the queue stays full for as long as a test needs; raw keep-alive connections.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from inprocess import Recorder, Served, http_post, raw_request, read_answer, sample, serve

from service.admission.policy import AdmissionPolicy
from service.settings import Settings

QUEUE = 4


Full = Callable[..., AbstractContextManager[tuple[Served, Recorder]]]


@pytest.fixture
def full(tiny_models: dict[str, Path]) -> Full:
    """`with full(**settings) as (served, recorder)`: a server whose batches are held (the
    gate is closed); `_fill` then holds one batch running and a full queue behind it."""

    @contextmanager
    def make(**kw: Any) -> Iterator[tuple[Served, Recorder]]:
        settings = Settings(
            model_id=str(tiny_models["text-classification"]),
            torch_num_threads=1,
            max_batch_size=1,
            max_queue_size=QUEUE,
            max_client_batch_size=QUEUE,
            **kw,
        )
        recorder = Recorder()
        with serve(settings, recorder) as served:
            recorder.gate.clear()
            yield served, recorder
            recorder.gate.set()

    return make


async def _fill(url: str) -> list[asyncio.Task[Any]]:
    """One request whose batch is held, and QUEUE inputs queued behind it."""
    held = asyncio.create_task(_exchange(url, http_post("held")))
    await asyncio.sleep(0.3)
    body = json.dumps({"inputs": [f"queued {i}" for i in range(QUEUE)]})
    queued = asyncio.create_task(_exchange(url, http_post(body, "application/json")))
    await asyncio.sleep(0.3)
    return [held, queued]


async def _exchange(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await raw_request(url, request)
    try:
        return await read_answer(reader)
    finally:
        writer.close()


def test_a_shed_is_decided_from_the_head_without_reading_the_body(
    full: Full,
) -> None:
    """The head announces 1 MB that is never sent: the 503 comes at once anyway."""

    async def scenario(url: str) -> tuple[int, dict[str, str], float]:
        await _fill(url)
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n"
        started = time.monotonic()
        reader, writer = await raw_request(url, head)
        status, headers, _ = await read_answer(reader)
        writer.close()
        return status, headers, time.monotonic() - started

    with full() as (served, _):
        before = sample("pipeline_server_shed_total", reason="queue_full")
        status, headers, seconds = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert seconds < 0.5 and "x-request-id" in headers
        assert sample("pipeline_server_shed_total", reason="queue_full") - before == 1


async def _two_on_one_connection(
    url: str, first_wait_s: float, second: str = "try #2"
) -> list[tuple[int, float]]:
    """Two requests on one keep-alive connection, the second `first_wait_s` after the first
    answer: (status, seconds to its answer) each. By default the second is a retry: the same
    route and body length as the first (`try #1`)."""
    reader, writer = await raw_request(url, http_post("try #1"))
    out = []
    started = time.monotonic()
    status, _, _ = await read_answer(reader)
    out.append((status, time.monotonic() - started))
    await asyncio.sleep(first_wait_s)
    writer.write(http_post(second))
    await writer.drain()
    started = time.monotonic()
    status, _, _ = await read_answer(reader)
    out.append((status, time.monotonic() - started))
    writer.close()
    return out


def test_an_early_retry_is_held_until_its_retry_after(
    full: Full,
) -> None:
    """First shed at once; the same connection asking again at once waits about Retry-After
    (1 s here) for its 503; a fresh connection meanwhile is answered at once."""

    async def scenario(url: str) -> tuple[list[tuple[int, float]], tuple[int, float]]:
        await _fill(url)
        storm = asyncio.create_task(_two_on_one_connection(url, 0.0))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        fresh, _, _ = await _exchange(url, http_post("fresh"))
        fresh_s = time.monotonic() - started
        return await storm, (fresh, fresh_s)

    with full() as (served, recorder):
        before = sample("pipeline_server_shed_total", reason="queue_full")
        (first, second), fresh = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert first[0] == 503 and first[1] < 0.3
        assert second[0] == 503 and 0.7 < second[1] < 1.5, second  # held, then shed
        assert fresh[0] == 503 and fresh[1] < 0.3  # another connection: not held
        # Counted once per answered shed, the held one included.
        assert sample("pipeline_server_shed_total", reason="queue_full") - before == 3
        assert "try #1" not in recorder.ran and "try #2" not in recorder.ran


def test_a_polite_retry_and_the_tarpit_off_are_answered_at_once(
    full: Full,
) -> None:
    async def scenario(url: str, wait_s: float) -> list[tuple[int, float]]:
        await _fill(url)
        return await _two_on_one_connection(url, wait_s)

    with full() as (served, _):  # waits Retry-After (1 s) before asking again
        first, second = asyncio.run(asyncio.wait_for(scenario(served.url, 1.05), 30))
        assert first[0] == second[0] == 503 and first[1] < 0.3 and second[1] < 0.3
    with full(shed_tarpit=False) as (served, _):  # asks again at once, nothing held
        first, second = asyncio.run(asyncio.wait_for(scenario(served.url, 0.0), 30))
        assert first[0] == second[0] == 503 and first[1] < 0.3 and second[1] < 0.3


def test_a_held_retry_is_admitted_when_room_frees_meanwhile(
    full: Full,
) -> None:
    """While held, the queue drains: the retry is then admitted and answered 200."""

    async def scenario(url: str, recorder: Recorder) -> list[tuple[int, float]]:
        await _fill(url)
        storm = asyncio.create_task(_two_on_one_connection(url, 0.0))
        await asyncio.sleep(0.4)  # its second request is held now
        recorder.gate.set()  # the model runs again: the queue drains
        return await storm

    with full() as (served, recorder):
        first, second = asyncio.run(asyncio.wait_for(scenario(served.url, recorder), 30))
        assert first[0] == 503 and second[0] == 200
        assert "try #2" in recorder.ran


def test_another_request_on_the_same_connection_is_not_held(full: Full) -> None:
    """Behind a proxy that pools its upstream connections, the next request on a connection is
    often another client's: another body length (or route) is no retry, and is answered at
    once."""

    async def scenario(url: str) -> list[tuple[int, float]]:
        await _fill(url)
        return await _two_on_one_connection(url, 0.0, second="another client's input")

    with full() as (served, _):
        first, second = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert first[0] == second[0] == 503 and first[1] < 0.3 and second[1] < 0.3


@pytest.fixture
def through_app(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request ids of the sheds answered by the app's gate (`AdmissionPolicy.shed` with
    `in_app`), in order; a shed the edge writes itself never gets there."""
    ids: list[str] = []
    shed = AdmissionPolicy.shed

    def recording(self: AdmissionPolicy, scope: Any, *args: Any, in_app: bool) -> Any:
        if in_app:
            ids.append(scope["state"]["request_id"])
        return shed(self, scope, *args, in_app=in_app)

    monkeypatch.setattr(AdmissionPolicy, "shed", recording)
    return ids


def test_the_edge_writes_a_shed_itself_as_the_app_would(full: Full, through_app: list[str]) -> None:
    """A shed decided from the head is written by the HTTP edge: the app's shed answer is never
    called for it. A request the edge leaves to the app (one through a proxy: X-Forwarded-For)
    gets the same status, headers and body from the app's path; each is counted once."""

    async def scenario(url: str) -> list[tuple[int, dict[str, str], bytes]]:
        await _fill(url)
        edge = await _exchange(url, http_post("one", **{"X-Request-ID": "edge-1"}))
        forwarded = {"X-Request-ID": "prox-1", "X-Forwarded-For": "10.1.2.3"}
        app = await _exchange(url, http_post("two", **forwarded))
        return [edge, app]

    with full() as (served, _):
        before = sample("pipeline_server_requests_total", route="/", status="503")
        shed_before = sample("pipeline_server_shed_total", reason="queue_full")
        edge, app = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert through_app == ["prox-1"]  # the first never reached the app's answer
        assert edge[0] == app[0] == 503
        assert edge[1]["x-request-id"] == "edge-1" and app[1]["x-request-id"] == "prox-1"
        same = {"x-request-id", "date"}  # the rest: content type and length, Retry-After, server
        assert {k: v for k, v in edge[1].items() if k not in same} == {
            k: v for k, v in app[1].items() if k not in same
        }
        edge_body, app_body = json.loads(edge[2]), json.loads(app[2])
        assert edge_body["error_type"] == "overloaded" and edge_body["request_id"] == "edge-1"
        assert {**edge_body, "request_id": "prox-1"} == app_body
        assert sample("pipeline_server_requests_total", route="/", status="503") - before == 2
        assert sample("pipeline_server_shed_total", reason="queue_full") - shed_before == 2


def test_requests_in_one_write_are_answered_in_order(full: Full, through_app: list[str]) -> None:
    """Three sheds in one write are each written by the edge as its head ends (the keep-alive
    timer the first one arms must not close the connection under the next two). Behind a
    `GET /livez` in one write, the two sheds are pipelined: they start when the probe's answer
    is sent and take the app's path, in order."""
    probe = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Request-ID: probe\r\n\r\n"

    async def one_write(url: str, head: bytes, ids: tuple[str, ...]) -> list[tuple[int, str]]:
        requests = b"".join(http_post(i, **{"X-Request-ID": i}) for i in ids)
        reader, writer = await raw_request(url, head + requests)
        try:
            answers = [await read_answer(reader) for _ in range(len(ids) + bool(head))]
        finally:
            writer.close()
        return [(status, headers["x-request-id"]) for status, headers, _ in answers]

    async def scenario(url: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        await _fill(url)
        # Bodies of other lengths: no retries of one another (the tarpit holds a retry).
        edge = await one_write(url, b"", ("e-1", "ee-2", "eee-3"))
        return edge, await one_write(url, probe, ("q-1", "qq-2"))

    with full() as (served, _):
        edge, pipelined = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert edge == [(503, "e-1"), (503, "ee-2"), (503, "eee-3")]
        assert pipelined == [(200, "probe"), (503, "q-1"), (503, "qq-2")]
        assert through_app == ["q-1", "qq-2"]


def test_only_a_request_with_the_api_key_is_shed_from_its_head(
    full: Full, through_app: list[str]
) -> None:
    """With API_KEY set, the head sheds only the requests that carry it, by the routes' own
    check (`service.admission.api_key`): at a full queue a request with the key gets its 503
    from the edge; one without it, or with a wrong one, gets the route's 401; none is queued."""
    key = {"Authorization": "Bearer s3cret"}
    asks = [key, {}, {"Authorization": "Bearer wrong"}, {"Authorization": "bearer s3cret"}]

    async def scenario(url: str) -> list[tuple[int, dict[str, str], bytes]]:
        held = asyncio.create_task(_exchange(url, http_post("held", **key)))
        await asyncio.sleep(0.3)
        body = json.dumps({"inputs": [f"queued {i}" for i in range(QUEUE)]})
        queued = asyncio.create_task(_exchange(url, http_post(body, "application/json", **key)))
        await asyncio.sleep(0.3)
        answers = [await _exchange(url, http_post("ask", **headers)) for headers in asks]
        for task in (held, queued):
            task.cancel()
        return answers

    with full(api_key="s3cret") as (served, recorder):
        answers = asyncio.run(asyncio.wait_for(scenario(served.url), 30))
        assert [status for status, _, _ in answers] == [503, 401, 401, 503]
        assert answers[1][1]["www-authenticate"] == "Bearer"
        assert json.loads(answers[2][2])["error_type"] == "unauthorized"
        assert through_app == []  # both 503s were written by the edge
        assert "ask" not in recorder.ran
