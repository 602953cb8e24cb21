"""Shared fixtures: tiny models, the embedded model, in-process clients and real servers."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite compares answers with float32 references (sentence-transformers, direct pipeline
# calls) at 1e-4 and starts dozens of servers: it runs torch float32 unless a test asks for
# another backend. Every backend against torch float32, and `auto`'s choice, are tested in
# tests/test_backends.py (servers included); the image test serves the default (auto).
os.environ.setdefault("BACKEND", "torch")
os.environ.setdefault("DTYPE", "float32")

from helpers import ServerProcess, app_client
from models import build

from service.engine.loading.load import default_model_dir

TASKS = (
    "fill-mask",
    "text-classification",
    "token-classification",
    "zero-shot-classification",
)


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the servers cache (calibration vectors, ONNX graphs) goes to this session's own
    folder, shared by its servers (the first server of a model fills it), not to ~/.cache:
    a test's tiny models would pile up there. XDG_CACHE_HOME, when set, is kept."""
    if "XDG_CACHE_HOME" not in os.environ:
        os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    return Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny BERT model folder per task (built once per test session)."""
    root = tmp_path_factory.mktemp("models")
    return {task: build(task, root / task) for task in TASKS}


@pytest.fixture(scope="session")
def cross_encoder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sequence classifier with one label (a reranker, to TEI)."""
    return build("cross-encoder", tmp_path_factory.mktemp("models") / "cross-encoder")


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    return Path(default_model_dir())


@pytest.fixture(scope="module")
def embedded_client(embedded_model: Path) -> Iterator[TestClient]:
    with app_client(embedded_model) as client:
        yield client


@pytest.fixture(scope="module")
def fill_mask_client(tiny_models: dict[str, Path]) -> Iterator[TestClient]:
    with app_client(tiny_models["fill-mask"], max_batch_wait_ms=20) as client:
        yield client


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start real servers (`start_server(MODEL_ID=..., ...)`); all are stopped at teardown."""
    started: list[ServerProcess] = []

    def start(**env: str) -> ServerProcess:
        server = ServerProcess(env, tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.terminate()
