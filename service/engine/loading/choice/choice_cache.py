"""`auto`'s choice, cached beside the ONNX export, so that a restart serves what the last start
chose, at once and identically.

Measuring every candidate takes seconds (most of a start: docs/backends.md) and its timings
move with the machine's load, so starts on one machine can choose differently (with vectors
that differ within the backends' tolerance). So the first start with `BACKEND=auto`
and `DTYPE=auto` writes its choice, the served candidate and the small-batch route
(`service.engine.loading.choice.candidates`), to

    $XDG_CACHE_HOME/pipeline-server/onnx/<model key>/choice-<machine key>.json

beside the exported graph (`service.backends.export`: `<model key>` covers the model's files,
torch's version and the opset), and later starts build those candidates without measuring.
`<machine key>` covers what else decides a choice: the versions of torch, onnxruntime and
transformers, the CPU (model name and flags from /proc/cpuinfo), torch's thread count, what
the engine answers and the pooling modes checked, and the checks with their bounds
(`service.engine.loading.choice.quality.checks_key`: a choice that passed other checks is not
reused). A change of any of them, or `BACKEND`/`DTYPE` set, chooses again; so does a cached choice
whose candidate no longer builds. Deleting the file chooses again at the next start.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = 1  # bumped when what is written changes


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU as it decides a choice: its model name and feature flags (first processor);
    the machine's architecture where /proc/cpuinfo is unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.machine()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    flags = " ".join(sorted(fields.get("flags", "").split()))
    return f"{fields.get('model name', platform.machine())}|{flags}"


def machine_key(what: str, threads: int) -> str:
    """SHA-256 (first 16 hex digits) of what besides the model decides a choice; `what`:
    what the engine answers and how it pools (the quality check depends on it)."""
    from service.engine.loading.choice.quality import checks_key

    parts = [
        f"format={FORMAT}",
        f"torch={_version('torch')}",
        f"onnxruntime={_version('onnxruntime')}",
        f"transformers={_version('transformers')}",
        f"cpu={cpu_identity()}",
        f"threads={threads}",
        f"engine={what}",
        f"checks={checks_key()}",
    ]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


def path_for(folder: Path, what: str, threads: int) -> Path:
    """Where the choice for the model in `folder` on this machine is cached."""
    from service.backends.export import cache_key, cache_root

    return cache_root() / cache_key(folder) / f"choice-{machine_key(what, threads)}.json"


def read(path: Path) -> dict[str, Any] | None:
    """The cached choice at `path`: `{"large": {backend, dtype}, "small": {backend, dtype,
    max_padded_tokens} or null, "summary": /info's backend object when it was chosen}`; None
    when there is none or it cannot be read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "large" not in doc:
        return None
    return doc


def write(path: Path, large: dict[str, str], small: dict[str, Any] | None, summary: Any) -> None:
    """Cache a choice (written to a temporary file and renamed: a reader never sees half of
    it). Raises `OSError` when the cache folder is not writable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "large": large, "small": small, "summary": summary}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    os.chmod(tmp, 0o644)
    tmp.replace(path)
