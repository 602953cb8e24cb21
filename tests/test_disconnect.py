"""Client disconnect: a request whose client has gone is cancelled, and its queued inputs never
reach the pipeline (issue 3). In-process under uvicorn, so the connection really closes and the
server sees the ASGI `http.disconnect`; a recording engine shows what ran."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from inprocess import Recorder, Served, http_post, raw_request, sample, serve

from service.settings import Settings

LONG = " ".join(["paris is the capital of france"] * 60)  # about 360 tokens


@pytest.fixture
def slow(tiny_models: dict[str, Path]) -> tuple[Served, Recorder]:  # type: ignore[misc]
    """MAX_BATCH_SIZE=1 and 0.4 s per batch: one blocker runs while the rest wait."""
    recorder = Recorder(0.4)
    settings = Settings(model_id=str(tiny_models["text-classification"]), max_batch_size=1)
    with serve(settings, recorder) as served:
        yield served, recorder


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in headers.items()}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def test_queued_inputs_of_a_gone_client_are_never_computed(slow: tuple[Served, Recorder]) -> None:
    served, recorder = slow
    cancelled = sample("pipeline_server_cancelled_total", reason="client_disconnect")
    gone_499 = sample("pipeline_server_requests_total", route="/", status="499")

    async def scenario() -> tuple[int, int]:
        blocker = await raw_request(served.url, http_post("blocker " + LONG))
        await asyncio.to_thread(recorder.wait_ran, "blocker " + LONG)
        # Three single inputs and one list of three, all queued behind the blocker.
        gone = [await raw_request(served.url, http_post(f"gone {i} " + LONG)) for i in range(3)]
        inputs = [f"gone list {i} " + LONG for i in range(3)]
        body = json.dumps({"inputs": inputs}).encode()
        head = http_post("x").replace("text/plain", "application/json")
        head = head.replace("Content-Length: 1", f"Content-Length: {len(body)}")
        gone.append(await raw_request(served.url, head, body))
        await asyncio.to_thread(served.wait_depth, 6)
        for _, writer in gone:  # the clients leave while their inputs are queued
            writer.close()
        status, _, _ = await _answer(blocker[0])
        await asyncio.to_thread(served.wait_depth, 0)
        blocker[1].close()
        after = await raw_request(served.url, http_post("after"))
        after_status, _, _ = await _answer(after[0])
        after[1].close()
        return status, after_status

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == (200, 200)
    ran = recorder.ran[recorder.ran.index("blocker " + LONG) :]
    assert ran == ["blocker " + LONG, "after"]  # no input of a gone client reached the pipeline
    assert sample("pipeline_server_cancelled_total", reason="client_disconnect") - cancelled == 6
    assert sample("pipeline_server_requests_total", route="/", status="499") - gone_499 == 4
    assert served.depth == 0
