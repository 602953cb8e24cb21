"""The ONNX graph: exported once and cached by the model's files (reused across restarts,
rebuilt when the model changes), or the model folder's own `onnx/model.onnx`
(`pipeline-server export`); and a real server on the default BACKEND=auto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from helpers import ServerProcess, captured_logs
from models import TEXT_LABELS, build

from service.backends.export import OPSET, cache_key, cache_root
from service.engine.loading.choice import candidates
from service.engine.loading.load import load_engine
from service.settings import Settings


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return build("text-classification", tmp_path / "model")


def exported(folder: Path) -> list[str]:
    """Load as the server does with BACKEND=onnx; the paths it exported (from its log)."""
    with captured_logs(candidates) as logs:
        engine = load_engine(Settings(model_id=str(folder), backend="onnx", dtype="float32"))
    assert engine.info.backend == "onnx"
    return [e["path"] for e in logs if e["event"] == "onnx_exported"]


def test_the_graph_is_reused_across_starts_and_rebuilt_when_the_model_changes(
    model: Path,
) -> None:
    (first,) = exported(model)
    assert Path(first) == cache_root() / cache_key(model) / "model.onnx"
    assert Path(first).stat().st_mode & 0o777 == 0o644  # readable by a pod's non-root user
    stamp = Path(first).stat().st_mtime_ns
    assert exported(model) == []  # a second start: read from the cache
    assert Path(first).stat().st_mtime_ns == stamp

    build("text-classification", model, seed=1)  # new weights in the same folder
    (second,) = exported(model)
    assert second != first and Path(first).is_file()


def test_the_graph_has_dynamic_axes_every_input_and_the_stated_opset(model: Path) -> None:
    (path,) = exported(model)
    graph = onnx.load(path)
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    for i in graph.graph.input:
        dims = [d.dim_param for d in i.type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]
    output_dims = graph.graph.output[0].type.tensor_type.shape.dim
    assert output_dims[0].dim_param == "batch"
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) == OPSET


def test_pipeline_server_export_writes_the_folders_own_graph(model: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "pipeline-server"
    done = subprocess.run(
        [str(script), "export"],
        env={"MODEL_ID": str(model), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    own = model / "onnx" / "model.onnx"
    assert own.is_file() and str(own) in done.stdout
    assert exported(model) == []  # the folder's own graph, as TEI reads it: nothing exported
    assert not cache_root().exists()


@pytest.mark.server
def test_a_server_on_the_default_backend_names_it_in_info_and_its_log(
    start_server: Callable[..., ServerProcess], model: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(model, tmp_path / "served")
    server = start_server(
        MODEL_ID=str(copy), BACKEND="auto", DTYPE="auto", XDG_CACHE_HOME=str(tmp_path / "xdg")
    )
    server.wait_ready()
    backend = server.get("/info").json()["model"]["backend"]
    rows = backend["candidates"]
    assert {("torch", "float32"), ("onnx", "float32")} <= {(r["backend"], r["dtype"]) for r in rows}
    best = max((r for r in rows if r["quality"]["passes"]), key=lambda r: r["inputs_per_s"]["32"])
    assert (backend["name"], backend["dtype"]) == (best["backend"], best["dtype"])
    assert backend["choice_s"] > 0
    assert "backend_chosen" in server.log()
    r = server.post("/", json={"inputs": "paris is nice"})
    assert r.status_code == 200
    assert {x["label"] for x in r.json()[0]} == set(TEXT_LABELS.values())
