"""A tiny BGE-M3 folder in FlagEmbedding's layout, and FlagEmbedding's own answers for it.

The folder is a two-layer XLM-R encoder (`family_models.backbone`, random, seeded) with the
tests' WordPiece tokenizer, its `[SEP]` also the EOS token as XLM-R's `</s>` is both, and the
two heads `BGEM3FlagModel` loads beside it: `colbert_linear.pt` (hidden -> `COLBERT_DIM`) and
`sparse_linear.pt` (hidden -> 1), each `torch.save(linear.state_dict())` as FlagEmbedding's
trainer saves them.

The reference is FlagEmbedding 1.4.2's `BGEM3FlagModel.encode` run by `m3_reference.py` in a
virtual environment of its own (its requirements are not the server's), built once per
machine under `~/.cache/pipeline-server-refs/` (`PIPELINE_SERVER_REFS` moves it). Only PyPI is
needed; a test skips, naming why, where the environment cannot be built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from family_models import backbone

# Narrower than the hidden size (32, BGE-M3's own width), so a head read at the wrong width
# would show; FlagEmbedding is told it (`colbert_dim`), the server reads it from the file.
COLBERT_DIM = 24
FLAGEMBEDDING = "FlagEmbedding==1.4.2"
_REFS = Path(os.environ.get("PIPELINE_SERVER_REFS", Path.home() / ".cache/pipeline-server-refs"))
_VENV = _REFS / "flagembedding-1.4.2"
# What `import FlagEmbedding` needs, pinned: 1.4.2 imports `transformers.modeling_attn_mask_utils`
# (gone in transformers 5), so its own transformers 4 and the versions that go with it;
# ir-datasets (its evaluation only) and the fine-tuning extras left out. torch pinned to the
# server's, so pip takes the CPU build it already has instead of a CUDA one.
_REQUIREMENTS = (
    "transformers==4.57.6",
    "sentence-transformers==5.7.0",
    "datasets==4.4.2",
    "accelerate==1.12.0",
    "peft==0.17.1",
    "sentencepiece",
    "protobuf",
)


def m3_model(folder: Path, seed: int = 0) -> Path:
    """The tiny BGE-M3 folder in `folder` (see the module docstring)."""
    import torch
    from transformers import AutoTokenizer

    backbone("xlm-roberta", folder, seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"eos_token": "[SEP]"})
    tokenizer.save_pretrained(folder)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    torch.manual_seed(seed + 1)
    colbert, sparse = torch.nn.Linear(hidden, COLBERT_DIM), torch.nn.Linear(hidden, 1)
    torch.save(colbert.state_dict(), folder / "colbert_linear.pt")
    torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
    return folder


def reference_python() -> Path | str:
    """The Python of FlagEmbedding's environment, built if missing; else a string saying why
    it could not be built (the caller skips with it)."""
    python = _VENV / "bin" / "python"
    if python.is_file() and _imports(python):
        return python
    import torch

    pins = (f"torch=={torch.__version__.split('+')[0]}",)
    steps = (
        [sys.executable, "-m", "venv", "--clear", str(_VENV)],
        [str(python), "-m", "pip", "install", "-q", "--no-deps", FLAGEMBEDDING],
        [str(python), "-m", "pip", "install", "-q", *pins, *_REQUIREMENTS],
    )
    _REFS.mkdir(parents=True, exist_ok=True)
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1200, check=False)
        if done.returncode != 0:
            return f"{' '.join(step[:5])} failed: {done.stderr.strip()[-300:]}"
    return python if _imports(python) else "FlagEmbedding does not import in its environment"


def _imports(python: Path) -> bool:
    done = subprocess.run(
        [str(python), "-c", "from FlagEmbedding import BGEM3FlagModel"],
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.returncode == 0


def flag_encode(python: Path, folder: Path, texts: list[str]) -> dict[str, Any]:
    """FlagEmbedding's `BGEM3FlagModel(folder, colbert_dim=COLBERT_DIM).encode(texts,
    return_dense=True, return_sparse=True, return_colbert_vecs=True)` in float32 on the CPU,
    as JSON: `dense` [n][D], `lexical_weights` [n]{id: weight}, `colbert_vecs`
    [n][tokens - 1][D]."""
    script = Path(__file__).with_name("m3_reference.py")
    done = subprocess.run(
        [str(python), str(script), str(folder), str(COLBERT_DIM)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
