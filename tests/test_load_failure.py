"""A model that cannot load: the real console script exits non-zero within seconds, its last
log line (under 300 characters) naming MODEL_ID and what is missing, the traceback only at
debug level. A wrong MODEL_ID is refused before gunicorn starts (status 2); a folder whose
weights are missing fails in the worker, which ends the server (status 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.servers import free_port
from service.engine.loading.load import default_model_dir
from service.load_failure import describe

SCRIPT = Path(sys.executable).with_name("pipeline-server")


def run_server(tmp_path: Path, **env: str) -> tuple[int, float, list[str]]:
    """The console script with `env`: its exit status, seconds, and its output's lines."""
    full = {
        **os.environ,
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),  # an empty cache
        **env,
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT)], env=full, capture_output=True, text=True, timeout=120, check=False
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, time.monotonic() - started, lines


def no_weights(tmp_path: Path) -> Path:
    """The embedded model's folder without its weights (config and tokenizer kept)."""
    folder = Path(shutil.copytree(default_model_dir(), tmp_path / "model"))
    (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.server
@pytest.mark.parametrize(
    ("model_id", "missing"),
    [
        ("/models/not-there", "no such folder"),
        ("./relative/folder", "no such folder"),
        ("sentence-transformers/not-a-model", "not in the Hugging Face cache"),
    ],
)
def test_a_wrong_model_id_stops_the_start_in_one_line(
    tmp_path: Path, model_id: str, missing: str
) -> None:
    status, seconds, lines = run_server(tmp_path, MODEL_ID=model_id)
    assert status == 2 and seconds < 10, (status, seconds)
    assert len(lines) == 1 and len(lines[-1]) < 300, lines
    assert f"MODEL_ID={model_id}" in lines[-1] and missing in lines[-1]


@pytest.mark.server
def test_a_folder_without_config_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    status, _, lines = run_server(tmp_path, MODEL_ID=str(tmp_path / "empty"))
    assert status == 2 and "has no config.json" in lines[-1] and str(tmp_path) in lines[-1]


@pytest.mark.server
def test_weights_missing_end_the_server_with_the_reason_last(tmp_path: Path) -> None:
    folder = no_weights(tmp_path)
    status, seconds, lines = run_server(tmp_path, MODEL_ID=str(folder), LOG_FORMAT="json")
    assert status == 3 and seconds < 90, (status, seconds)
    last = lines[-1]
    assert len(last) < 300, last
    assert f"MODEL_ID={folder}" in last and "model.safetensors" in last
    assert not any("Traceback" in line for line in lines)  # at info: no traceback
    failed = [line for line in lines if '"model_load_failed"' in line]
    assert len(failed) == 1 and "model.safetensors" in failed[0]

    status, _, debug = run_server(tmp_path, MODEL_ID=str(folder), LOG_LEVEL="debug")
    assert status == 3
    traceback_at = next(i for i, line in enumerate(debug) if "model_load_traceback" in line)
    assert traceback_at < len(debug) - 1 and "model.safetensors" in debug[-1]


def test_the_line_names_the_original_error_of_a_pipeline_message() -> None:
    """transformers' pipeline wraps each class's traceback in one message; the line keeps the
    original error, short."""
    wrapped = ValueError(
        "Could not load model /m with any of the following classes: (<class 'AutoModel'>,). "
        "See the original errors:\n\nwhile loading with AutoModel, an error is thrown:\n"
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    raise OSError(\n'
        "OSError: Error no file named model.safetensors, or pytorch_model.bin, found in "
        "directory /m.\n"
    )
    assert describe("/m", wrapped) == (
        "MODEL_ID=/m could not be loaded: no file named model.safetensors, or "
        "pytorch_model.bin, found in directory /m."
    )
    assert describe("x", OSError("short")) == "MODEL_ID=x could not be loaded: short"
    assert len(describe("m" * 50, RuntimeError("y" * 1000))) == 200
