"""`auto`'s backend choice, cached beside the ONNX export
(service.engine.loading.choice.choice_cache): a restart reuses it without measuring and serves the
same backends; a changed model, machine key, or BACKEND/DTYPE set chooses again. Two consecutive
starts of the real server too, with their `model_ready` lines and a 4xx line carrying its reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import ServerProcess, captured_logs
from models import build

from service.backends.export import cache_key, cache_root
from service.engine.loading.choice import candidates, choice_cache, quality
from service.engine.loading.load import load_engine
from service.settings import Settings


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return build("text-classification", tmp_path / "model")


def start(folder: Path, backend: str = "auto", dtype: str = "auto") -> tuple[Any, dict[str, Any]]:
    """Load as the server does; the engine's /info backend object and the backend_chosen line."""
    with captured_logs(candidates) as logs:
        engine = load_engine(Settings(model_id=str(folder), backend=backend, dtype=dtype))  # type: ignore[arg-type]
    (line,) = [e for e in logs if e["event"] == "backend_chosen"]
    return dict(engine.info.backend_summary), line


def served(summary: dict[str, Any]) -> tuple[Any, ...]:
    return summary["name"], summary["dtype"], json.dumps(summary.get("small_batches"))


def test_a_restart_reuses_the_choice_without_measuring(model: Path) -> None:
    first, _ = start(model)
    assert "reused" not in first
    (cached,) = (cache_root() / cache_key(model)).glob("choice-*.json")
    assert cached.stat().st_mode & 0o777 == 0o644  # readable by a pod's non-root user
    second, line = start(model)
    assert second["reused"] is True and line["reused"] is True
    assert served(second) == served(first)
    assert second["candidates"] == first["candidates"]  # what the measuring start saw
    assert second["measured_s"] == first["choice_s"]


def test_backend_or_dtype_set_chooses_again_and_a_changed_model_too(model: Path) -> None:
    start(model)
    pinned, _ = start(model, "torch", "auto")
    assert "reused" not in pinned
    build("text-classification", model, seed=1)  # new weights: a new model key
    changed, _ = start(model)
    assert "reused" not in changed


def test_an_unreadable_or_foreign_cache_file_is_measured_over(model: Path) -> None:
    start(model)
    (cached,) = (cache_root() / cache_key(model)).glob("choice-*.json")
    doc = json.loads(cached.read_text())
    cached.write_text("{not json")
    assert "reused" not in start(model)[0]
    doc["large"] = {"backend": "torch", "dtype": "float16"}  # not a candidate on this CPU
    cached.write_text(json.dumps(doc))
    again, _ = start(model)  # measured: it may choose otherwise (the timings move)
    assert "reused" not in again
    rewritten = json.loads(cached.read_text())["large"]  # and cached what it chose
    assert (rewritten["backend"], rewritten["dtype"]) == served(again)[:2]


def test_the_machine_key_covers_threads_what_the_engine_answers_and_the_cpu(tmp_path: Path) -> None:
    key = choice_cache.machine_key
    assert key("pooled:mean", 2) == key("pooled:mean", 2)
    assert len({key("pooled:mean", 2), key("pooled:mean", 1),
                key("classifier:", 2), key("pooled:cls", 2)}) == 4  # fmt: skip
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: sse avx512_bf16 avx2\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: sse\n"
    )
    assert choice_cache.cpu_identity(cpuinfo) == "AMD EPYC 9B45|avx2 avx512_bf16 sse"
    assert choice_cache.cpu_identity(tmp_path / "missing")  # the architecture, at least


def test_a_choice_made_under_other_checks_is_not_reused(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bound changed (or a check added) changes the machine key: the choice cached when
    only the old checks ran is measured over."""
    start(model)
    key = choice_cache.machine_key("classifier::sigmoid", 2)
    monkeypatch.setitem(quality.BOUNDS, "max_prob_diff", ("<=", 5e-4))
    assert choice_cache.machine_key("classifier::sigmoid", 2) != key
    again, _ = start(model)
    assert "reused" not in again
    assert again["checks"] == {
        "max_prob_diff": "<= 0.0005",
        "top_label_kept": "true",
    }
    assert len(list((cache_root() / cache_key(model)).glob("choice-*.json"))) == 2


@pytest.mark.server
def test_two_consecutive_starts_serve_the_same_cached_choice(
    start_server: Callable[..., ServerProcess], model: Path, tmp_path: Path
) -> None:
    env = {"MODEL_ID": str(model), "BACKEND": "auto", "DTYPE": "auto", "LOG_FORMAT": "json"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    infos, readies = [], []
    for _ in range(2):
        server = start_server(**env)
        server.wait_ready()
        infos.append(server.get("/info").json()["model"]["backend"])
        bad = server.post("/", json={"inputs": ""})
        assert bad.status_code == 422
        assert server.terminate() == 0
        lines = server.log().splitlines()
        (ready,) = [x for x in lines if '"model_ready"' in x]
        readies.append(ready)
        (request,) = [x for x in lines if '"request"' in x and '"status":422' in x]
        assert '"error_type":"invalid_input"' in request and "inputs is empty" in request
    assert served(infos[1]) == served(infos[0]) and infos[1]["reused"] is True
    for ready, choice in zip(readies, ("measured", "reused"), strict=True):
        assert len(ready) < 300, ready
        fields = json.loads(ready)
        assert fields["choice"] == choice and fields["load_s"] > 0
        assert (fields["backend"], fields["dtype"]) == served(infos[0])[:2]
