"""Where MODEL_ID points, checked before anything loads (the console script's preflight): a
wrong MODEL_ID stops the start at once, in one line naming it and what is missing, instead of a
worker that fails its load after gunicorn has started (`service.load_failure`).

- a local folder must hold `config.json` (transformers' model folders do: with the weights and
  the tokenizer's files beside it), or sentence-transformers' `modules.json` (a static
  embedding model has no config.json);
- a MODEL_ID that is not a folder and cannot be a Hub id (`org/name` or `name`) is a folder
  that does not exist;
- a Hub id, while HF_HUB_OFFLINE is set, must be in the local Hugging Face cache (its
  `config.json` at REVISION); online it is fetched when the model loads.
"""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_id(model_id: str, revision: str | None) -> None:
    """Raise `ValueError` (one line, naming MODEL_ID and what is missing) when `model_id`
    cannot name a model to load (see the module docstring)."""
    folder = Path(model_id).expanduser()
    if folder.is_dir():
        if not any((folder / name).is_file() for name in ("config.json", "modules.json")):
            raise ValueError(
                f"MODEL_ID={model_id}: the folder has no config.json (a model folder holds "
                "config.json, the weights and the tokenizer files) nor modules.json (a "
                "sentence-transformers static embedding folder)"
            )
        return
    if folder.exists():
        raise ValueError(f"MODEL_ID={model_id}: not a folder")
    if not _HUB_ID.match(model_id) or model_id.startswith((".", "~")):
        raise ValueError(f"MODEL_ID={model_id}: no such folder")
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return
    cached = try_to_load_from_cache(model_id, "config.json", revision=revision)
    if not isinstance(cached, str):
        at = f" at revision {revision}" if revision else ""
        raise ValueError(
            f"MODEL_ID={model_id}: no such folder, and not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}){at}; HF_HUB_OFFLINE=1 forbids downloading it"
        )
