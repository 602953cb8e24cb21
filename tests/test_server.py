"""The real server: the console script (gunicorn + uvicorn worker) with the embedded model."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import numpy as np
import pytest
from helpers import SEED_TEXT, ServerProcess

pytestmark = pytest.mark.server


def _sentence_vector(rows: list[list[list[float]]]) -> np.ndarray:
    """Mean over token rows, normalized (all-MiniLM-L6-v2's sentence-transformers pooling)."""
    v = np.asarray(rows[0]).mean(axis=0)
    return np.asarray(v / np.linalg.norm(v))


def test_seed_curl_and_paraphrases(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server()
    server.wait_ready()
    out = subprocess.run(
        ["curl", "-s", "-X", "POST", "-d", SEED_TEXT, server.url + "/"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    rows = json.loads(out.stdout)
    assert np.asarray(rows).shape == (1, 9, 384)  # [CLS] paris is the [MASK] of france . [SEP]

    def embed(text: str) -> np.ndarray:
        r = server.post(json={"inputs": text})
        assert r.status_code == 200, r.text
        return _sentence_vector(r.json())

    a = embed("A man is playing a guitar.")
    b = embed("Someone plays the guitar.")
    c = embed("The stock market fell sharply today.")
    assert float(a @ b) > float(a @ c) + 0.2
    assert server.terminate() == 0
    log = server.log()
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    events = {x["event"] for x in lines}
    assert {"model_ready", "batch", "request"} <= events
    assert any(x["logger"] == "gunicorn.error" for x in lines)  # gunicorn's lines are JSON too
    assert "guitar" not in log  # input text never reaches the log


def test_bad_setting_stops_the_start_with_one_line(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(MAX_BATCH_SIZE="zero")
    assert server.proc.wait(30) == 2
    assert server.log().strip().splitlines() == [
        "pipeline-server: invalid setting MAX_BATCH_SIZE: Input should be a valid integer, "
        "unable to parse string as an integer (got 'zero')"
    ]
