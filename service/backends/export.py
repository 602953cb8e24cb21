"""The ONNX export, once per model: cached in the writable cache folder, or the folder's own.

The graph: the model's first output (`output`) from every input the tokenizer gives it
(`input_ids`, `attention_mask`, `token_type_ids` where it takes them), batch and sequence axes
dynamic, opset `OPSET`, exported with torch's TorchScript-based exporter (`dynamo=False`: it
traces one forward in seconds, where the dynamo exporter takes tens of seconds per model).

Where a graph comes from, first found: the model folder's own `onnx/model.onnx` (as
text-embeddings-inference reads it; `pipeline-server export` writes it there, e.g. in the
image's model stage), else `$XDG_CACHE_HOME/pipeline-server/onnx/<key>/model.onnx` (default
`~/.cache/...`), exported there on first use. `<key>` is a SHA-256 of the model folder's files
(names and contents, the `onnx/` folder left out), torch's version and `OPSET`: the same model
reuses it across restarts; changed weights or config, or another exporter, export again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from service.settings import cache_home

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

OPSET = 17
FORMAT = 1  # bumped when what we export changes (inputs, outputs, options)
GRAPH_NAME = "model.onnx"


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/pipeline-server/onnx` (the image sets XDG_CACHE_HOME=/cache)."""
    return cache_home() / "pipeline-server" / "onnx"


def own_graph(folder: Path) -> Path | None:
    """The model folder's own `onnx/model.onnx`, if it has one."""
    path = folder / "onnx" / GRAPH_NAME
    return path if path.is_file() else None


def cache_key(folder: Path) -> str:
    """SHA-256 (first 24 hex digits) of the folder's files by name and content (recursive, the
    `onnx/` folder and hidden files left out), torch's version, `OPSET` and `FORMAT`. Reads
    every byte of the weights: about 0.1 s for a 90 MB model."""
    import torch

    digest = hashlib.sha256(f"torch={torch.__version__};opset={OPSET};v={FORMAT}".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if relative.parts[0] == "onnx" or any(part.startswith(".") for part in relative.parts):
            continue
        digest.update(str(relative).encode() + b"\0")
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:24]


def cached_graph(
    model: PreTrainedModel, folder: Path, example: Mapping[str, torch.Tensor]
) -> tuple[Path, bool]:
    """The graph for the model of `folder`: its own, else the cache's, else exported into the
    cache now. Returns (path, exported now). Raises what the export raises (a model that does
    not trace); an unwritable cache folder raises `OSError`."""
    own = own_graph(folder)
    if own is not None:
        return own, False
    target = cache_root() / cache_key(folder) / GRAPH_NAME
    if target.is_file():
        return target, False
    export(model, example, target)
    return target, True


def export(model: PreTrainedModel, example: Mapping[str, torch.Tensor], target: Path) -> None:
    """Export `model`'s first output for the inputs named in `example` (int64 tensors [B, L])
    to `target`, with dynamic batch and sequence axes. Written to a temporary file in the same
    folder and renamed, so a reader never sees half a graph and two writers do not clash."""
    import torch

    names = list(example)
    first = _FirstOutput(model, names).eval()
    args = tuple(example[n] for n in names)
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in names}
    with torch.no_grad():
        rank = first(*args).dim()
    # [B, L, H] or [B, L, vocab]: batch and sequence; a classifier's [B, labels]: batch only
    axes["output"] = {0: "batch", 1: "sequence"} if rank == 3 else {0: "batch"}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=target.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
            torch.onnx.export(
                first,
                args,
                tmp,
                input_names=names,
                output_names=["output"],
                dynamic_axes=axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        publish(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def publish(tmp: str, target: Path) -> None:
    """Rename the finished `tmp` to `target`, mode 0o644: `mkstemp` makes it 0o600, and a graph
    baked by root in an image's build stage must be readable by the non-root user the pod runs
    as (the image test serves it)."""
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def write_own_graph(
    model: PreTrainedModel, folder: Path, example: Mapping[str, torch.Tensor]
) -> Path:
    """Export into the model folder's own `onnx/model.onnx` (`pipeline-server export`)."""
    target = folder / "onnx" / GRAPH_NAME
    export(model, example, target)
    return target


class _FirstOutput:
    """`model(**named inputs)[0]` as a module taking positional tensors (what tracing feeds)."""

    def __new__(cls, model: PreTrainedModel, names: list[str]) -> torch.nn.Module:
        import torch

        class FirstOutput(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: torch.Tensor) -> torch.Tensor:
                return self.model(**dict(zip(names, args, strict=True)))[0]

        return FirstOutput()
