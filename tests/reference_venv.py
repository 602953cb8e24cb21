"""Reference libraries whose pins clash with the project's (PyLate pins sentence-transformers 5 and
transformers <= 5.3) or that pull far more than the tests need (Chroma), each in its own virtual
environment built once per machine under `~/.cache/pipeline-server-refs/<name>` (or
`$PIPELINE_SERVER_REFS`), and run there in a subprocess: a script reads JSON on stdin and writes
JSON on stdout.

`torch==2.13.0` is pinned in each that needs torch: pip finds the CPU wheel on this machine,
where a bare `torch` would pull a multi-GB CUDA build. A venv that cannot be built (no registry,
no wheel) makes
`reference_python` raise `ReferenceUnavailable`; tests skip on it with its reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: PyLate 1.6 with the versions it pins, installed without its index-building dependencies
#: (fast-plaid, fastkmeans, ninja: not imported by `pylate.models` or `pylate.scores`).
PYLATE = (
    "pylate-1.6.0",
    [
        ["torch==2.13.0", "transformers==5.3.0", "sentence-transformers==5.3.0", "datasets"],
        ["--no-deps", "pylate==1.6.0", "ujson==5.12.0"],
    ],
)

#: Chroma's client, for its `JinaEmbeddingFunction` (`tests/chroma_jina_reference.py`): it pulls
#: gRPC, OpenTelemetry and the Kubernetes client, which the project does not need.
CHROMA = ("chromadb-1.5.9", [["chromadb==1.5.9", "pillow"]])


class ReferenceUnavailable(RuntimeError):
    """The reference venv could not be built here (the message says why)."""


def _root() -> Path:
    default = Path.home() / ".cache" / "pipeline-server-refs"
    return Path(os.environ.get("PIPELINE_SERVER_REFS", default))


def reference_python(spec: tuple[str, list[list[str]]]) -> Path:
    """The venv's python, building the venv first if it is not there yet (`spec`: its folder
    name and the pip installs, in order). A finished build leaves a `.ready` file."""
    name, installs = spec
    venv = _root() / name
    python = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)]]
    steps += [[str(python), "-m", "pip", "install", "-q", *args] for args in installs]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ReferenceUnavailable(f"{name}: {' '.join(step[-3:])} failed: {' | '.join(tail)}")
    (venv / ".ready").write_text("ok\n")
    return python


def run_reference(python: Path, script: Path, request: dict[str, Any]) -> Any:
    """Run `script` with the reference venv's python, `request` as JSON on stdin; its JSON
    answer on stdout. The project's own packages are not on its path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [str(python), str(script)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)
