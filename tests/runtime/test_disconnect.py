"""Client disconnect: a request whose client has gone is cancelled, and its queued inputs never
reach the pipeline. In-process under uvicorn, so the connection really closes and the
server sees the ASGI `http.disconnect`; a recording engine shows what ran."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from inprocess import Recorder, Served, http_post, raw_request, read_answer, sample, serve

from service.settings import Settings

LONG = " ".join(["paris is the capital of france"] * 60)  # about 360 tokens


@pytest.fixture(params=["edge", "uvicorn"])
def slow(  # type: ignore[misc]
    tiny_models: dict[str, Path], request: pytest.FixtureRequest
) -> tuple[Served, Recorder]:
    """MAX_BATCH_SIZE=1 and 0.4 s per batch: one blocker runs while the rest wait. Under the
    service's edge (whose connection calls back on a close) and under uvicorn's own protocol
    (where the runtime awaits `http.disconnect`)."""
    recorder = Recorder(0.4, delay_warm_up=False)  # the load's warm-up and calibration: fast
    settings = Settings(
        model_id=str(tiny_models["text-classification"]), max_batch_size=1, torch_num_threads=1
    )
    with serve(settings, recorder, edge=request.param == "edge") as served:
        recorder.slow.set()
        yield served, recorder


@contextmanager
def _errors(logger: str) -> Iterator[list[str]]:
    """Messages `logger` logs at ERROR meanwhile."""
    found: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record.getMessage())

    handler = Catch(logging.ERROR)
    logging.getLogger(logger).addHandler(handler)
    try:
        yield found
    finally:
        logging.getLogger(logger).removeHandler(handler)


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
        body = json.dumps({"inputs": inputs})
        gone.append(await raw_request(served.url, http_post(body, "application/json")))
        await asyncio.to_thread(served.wait_depth, 6)
        for _, writer in gone:  # the clients leave while their inputs are queued
            writer.close()
        status, _, _ = await read_answer(blocker[0])
        await asyncio.to_thread(served.wait_depth, 0)
        blocker[1].close()
        after = await raw_request(served.url, http_post("after"))
        after_status, _, _ = await read_answer(after[0])
        after[1].close()
        return status, after_status

    with _errors("asyncio") as errors:  # e.g. "exception was never retrieved"
        assert asyncio.run(asyncio.wait_for(scenario(), 30)) == (200, 200)
        gc.collect()  # asyncio reports "exception was never retrieved" when a future is freed
    assert errors == []  # no error line per disconnect (a flood under load)
    ran = recorder.ran[recorder.ran.index("blocker " + LONG) :]
    assert ran == ["blocker " + LONG, "after"]  # no input of a gone client reached the pipeline
    assert sample("pipeline_server_cancelled_total", reason="client_disconnect") - cancelled == 6
    assert sample("pipeline_server_requests_total", route="/", status="499") - gone_499 == 4
    assert served.depth == 0


def test_a_failed_input_cancels_the_rest_of_its_request(slow: tuple[Served, Recorder]) -> None:
    """One bad input answers the whole list 422; its other inputs are not computed for nobody."""
    served, recorder = slow
    failed = sample("pipeline_server_cancelled_total", reason="request_failed")
    over_limit = "word " * 600  # over the tiny model's 512 tokens: found in the thread

    async def scenario() -> tuple[int, int]:
        blocker = await raw_request(served.url, http_post("blocker " + LONG))
        await asyncio.to_thread(recorder.wait_ran, "blocker " + LONG)
        body = json.dumps({"inputs": ["sibling 0", over_limit, "sibling 2", "sibling 3"]})
        mixed = await raw_request(served.url, http_post(body, "application/json"))
        status, _, _ = await read_answer(mixed[0])
        blocker_status, _, _ = await read_answer(blocker[0])
        for _, writer in (blocker, mixed):
            writer.close()
        await asyncio.to_thread(served.wait_depth, 0)
        return status, blocker_status

    with _errors("asyncio") as errors:  # e.g. "exception was never retrieved"
        assert asyncio.run(asyncio.wait_for(scenario(), 30)) == (422, 200)
        gc.collect()
    assert errors == []
    # The thread finds the bad input while preparing the list, and may start on the input
    # before it at once; every input after it is cancelled before its batch.
    ran = [text for text in recorder.ran if text.startswith("sibling")]
    assert ran in ([], ["sibling 0"])
    cancelled = sample("pipeline_server_cancelled_total", reason="request_failed") - failed
    assert cancelled == 3 - len(ran)


def test_a_client_gone_during_its_upload_is_counted_499_not_500(
    slow: tuple[Served, Recorder],
) -> None:
    served, _ = slow
    gone_499 = sample("pipeline_server_requests_total", route="/", status="499")
    failed_500 = sample("pipeline_server_requests_total", route="/", status="500")

    async def scenario() -> None:
        head = http_post("x" * 1000)[:-990]  # the head and 10 of the 1000 bytes announced
        _, writer = await raw_request(served.url, head)
        await asyncio.sleep(0.2)
        writer.close()
        await asyncio.sleep(0.3)

    with _errors("service.app") as errors:
        asyncio.run(asyncio.wait_for(scenario(), 10))
    assert errors == []  # not an "unhandled_error" with a traceback
    assert sample("pipeline_server_requests_total", route="/", status="500") == failed_500
    assert sample("pipeline_server_requests_total", route="/", status="499") - gone_499 == 1
