"""`pipeline-server export`: write the model folder's own `onnx/model.onnx` ahead of time.

The image's model stage runs it, so a server starts without exporting (it reads the folder's
own graph first, as text-embeddings-inference does). Reads MODEL_ID, TASK and the rest from
the environment like the server; fill-mask and token-classification have nothing to export.
"""

from __future__ import annotations

import time
from pathlib import Path

from service.settings import Settings


def export_model(settings: Settings) -> Path:
    """Load the model as the server would (float32, torch), export its graph into its folder;
    return the graph's path. Raises `ValueError` for a task that runs on torch only or a
    model that is not a local folder, and what the export raises."""
    from service.backends.export import write_own_graph
    from service.engine.forward.encoder import EncoderEngine
    from service.engine.loading.choice.backend_choice import sample_inputs
    from service.engine.loading.load import load_engine

    forced = settings.model_copy(update={"backend": "torch", "dtype": "float32"})
    engine = load_engine(forced)
    if not isinstance(engine, EncoderEngine):
        raise ValueError(f"{engine.info.task} runs on torch: there is nothing to export")
    model = engine.pipe.model
    folder = Path(model.name_or_path)
    if not folder.is_dir():
        raise ValueError(f"MODEL_ID={settings.model_id} is not a local folder")
    return write_own_graph(model, folder, sample_inputs(engine))


def main(settings: Settings) -> None:
    started = time.perf_counter()
    path = export_model(settings)
    print(f"pipeline-server: exported {path} in {time.perf_counter() - started:.1f}s")
