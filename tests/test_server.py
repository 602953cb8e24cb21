"""The real server: the console script (gunicorn + uvicorn worker) with the embedded model."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import SEED_TEXT, ServerProcess
from models import build_sentence_model

from service.engine.loading.load import default_model_dir

pytestmark = pytest.mark.server


def test_seed_curl_and_paraphrases(start_server: Callable[..., ServerProcess]) -> None:
    """The seed's curl answers the sentence embedding sentence-transformers makes (1 x 384)."""
    from sentence_transformers import SentenceTransformer

    server = start_server()
    server.wait_ready()
    out = subprocess.run(
        ["curl", "-s", "-X", "POST", "-d", SEED_TEXT, server.url + "/"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    vector = np.asarray(json.loads(out.stdout))
    assert vector.shape == (1, 384)
    st = SentenceTransformer(default_model_dir(), device="cpu")
    assert np.abs(vector[0] - st.encode([SEED_TEXT])[0]).max() < 1e-4

    def embed(text: str) -> np.ndarray:
        r = server.post(json={"inputs": text})
        assert r.status_code == 200, r.text
        return np.asarray(r.json()[0])

    a = embed("A man is playing a guitar.")
    b = embed("Someone plays the guitar.")
    c = embed("The stock market fell sharply today.")
    assert float(a @ b) > float(a @ c) + 0.2
    # torch's OpenMP threads spin briefly (service.engine.loading.cpu_threads): the worker got the
    # spin count from the console script, unless the environment chose its own.
    import os

    import psutil  # type: ignore[import-untyped]

    (worker,) = psutil.Process(server.proc.pid).children()
    chose = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
    wanted = os.environ.get("GOMP_SPINCOUNT") if chose else "2000"
    assert worker.environ().get("GOMP_SPINCOUNT") == wanted
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


def test_oversize_request_head_is_refused_and_the_worker_lives(
    start_server: Callable[..., ServerProcess],
) -> None:
    """A 1 MB header is refused by the HTTP edge (431, connection closed) long before it could
    stall the event loop; the same worker keeps serving. The answer arrives although the client
    was still sending when it was refused: the edge drains the rest before closing."""
    server = start_server()
    server.wait_ready()
    head = b"POST / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"x" * 1_000_000 + b"\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + b"Content-Length: 5\r\n\r\nhello")
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), reply[:100]
    assert server.post(content="A fixed control sentence.").status_code == 200
    assert server.terminate() == 0
    assert server.log().count("Booting worker") == 1 and "WORKER TIMEOUT" not in server.log()


@pytest.mark.parametrize(
    "env, message",
    [
        ({"TASK": "bogus"}, "invalid setting TASK: unsupported task; use one of "),
        ({"DRAIN_TIMEOUT_S": "inf"}, "invalid setting DRAIN_TIMEOUT_S: Input should be a finite"),
    ],
)
def test_more_bad_settings_stop_the_start(
    start_server: Callable[..., ServerProcess], env: dict[str, str], message: str
) -> None:
    server = start_server(**env)
    assert server.proc.wait(30) == 2
    lines = server.log().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeline-server: " + message), lines


def test_a_sentence_model_with_modules_we_cannot_apply_is_refused_at_start(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A Dense module (LaBSE, sentence-t5) after pooling: one line naming it, exit 2."""
    folder = build_sentence_model(tmp_path / "dense", ("mean",), normalize=False)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    server = start_server(MODEL_ID=str(folder))
    assert server.proc.wait(30) == 2
    lines = server.log().strip().splitlines()
    assert len(lines) == 1 and "Dense" in lines[0] and "2_Dense" in lines[0], lines
