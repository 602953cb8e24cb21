"""Run in PyLate's own venv (`tests/reference_venv.py`), never imported by the suite: reads one
JSON request on stdin, writes one JSON answer on stdout.

- `{"save": {"backbone": path, "folder": path, "seed": int, "options": {...}}}`: PyLate's
  `models.ColBERT(backbone, **options)` (its Dense projection drawn after `torch.manual_seed`),
  saved by `ColBERT.save` into `folder`, as published PyLate checkpoints are.
- `{"encode": {"folder": path, "queries": [...], "documents": [...], "pool_factor": int}}`:
  `ColBERT.encode` of the queries (`is_query=True`) and documents (`is_query=False`, and with
  `pool_factor` PyLate's own hierarchical pooling), and `scores.colbert_scores` of each query
  against the documents (zero-padded, with their mask). Vectors as nested lists of floats.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any


def save(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from pylate import models

    torch.manual_seed(int(request.get("seed", 0)))
    model = models.ColBERT(request["backbone"], device="cpu", **request.get("options", {}))
    model.save(request["folder"], create_model_card=False)
    return {"folder": request["folder"]}


def encode(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from pylate import models, scores

    model = models.ColBERT(request["folder"], device="cpu")
    queries = model.encode(request["queries"], is_query=True, convert_to_numpy=True)
    documents = model.encode(request["documents"], is_query=False, convert_to_numpy=True)
    padded = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(d) for d in documents], True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(d)) for d in documents], True)
    answer: dict[str, Any] = {
        "queries": [q.tolist() for q in queries],
        "documents": [d.tolist() for d in documents],
        "scores": [
            scores.colbert_scores(torch.from_numpy(q)[None], padded, documents_mask=mask)[0]
            .float()
            .tolist()
            for q in queries
        ],
    }
    pool_factor = int(request.get("pool_factor", 1))
    if pool_factor > 1:
        pooled = model.encode(
            request["documents"],
            is_query=False,
            convert_to_numpy=True,
            pool_factor=pool_factor,
        )
        answer["pooled"] = [d.tolist() for d in pooled]
    return answer


def main() -> None:
    request = json.loads(sys.stdin.read())
    # what the libraries print (progress bars included) goes to stderr: stdout is the answer
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    with contextlib.redirect_stdout(sys.stderr):
        answer = save(request["save"]) if "save" in request else encode(request["encode"])
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer))


if __name__ == "__main__":
    main()
