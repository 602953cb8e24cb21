"""How much of float's similarity structure int8 and uint8 embeddings keep (docs/api.md, int8
and uint8).

Starts the server (the default model; another with `MODEL_ID`), embeds two sets drawn from
`loadtest/corpus.txt` through `POST /v2/embed` as float, int8 and uint8 (the calibrated
ranges, `service.engine.loading.quantization`), and prints for each encoding against float, scored
with the dot product and with the cosine of the codes (what a vector store's `dot` and
`cosine` metrics compute):

- `spearman`: the rank correlation of all pairwise similarities;
- `top10`: the share of each text's 10 nearest neighbours under float that stay among its 10
  nearest under the codes, averaged over the texts.

The sets: every sentence of the corpus, and the benchmark's mixed inputs (`mixed_inputs(256)`:
a five-word sentence to a passage of a few hundred tokens).

    python -m loadtest.experiments.int8_quality [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

import numpy as np

from loadtest.corpus import mixed_inputs, sentences
from loadtest.servers import free_port, pipeline_server_command, started

BATCH = 32


def embed(base: str, texts: list[str]) -> dict[str, np.ndarray]:
    """float, int8 and uint8 vectors of `texts` (search_document), in order."""
    out: dict[str, list[Any]] = {"float": [], "int8": [], "uint8": []}
    for start in range(0, len(texts), BATCH):
        body = {
            "texts": texts[start : start + BATCH],
            "input_type": "search_document",
            "embedding_types": list(out),
        }
        request = urllib.request.Request(
            base + "/v2/embed",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.load(response)["embeddings"]
        for name in out:
            out[name].extend(answer[name])
    return {name: np.asarray(rows, dtype=np.float64) for name, rows in out.items()}


def similarities(x: np.ndarray, metric: str) -> np.ndarray:
    if metric == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x @ x.T


def ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share theirs), as Spearman's correlation takes them."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    out = np.empty(len(values))
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        out[order[start : stop + 1]] = (start + stop) / 2
        start = stop + 1
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def top_k_kept(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean share of each row's k nearest (itself left out) under `reference` kept by `other`."""
    n = len(reference)
    kept = []
    for i in range(n):
        mask = np.arange(n) != i
        near = set(np.argsort(-reference[i][mask], kind="stable")[:k])
        kept.append(len(near & set(np.argsort(-other[i][mask], kind="stable")[:k])) / k)
    return float(np.mean(kept))


def report(name: str, vectors: dict[str, np.ndarray]) -> list[str]:
    n = len(vectors["float"])
    upper = np.triu_indices(n, 1)
    reference = similarities(vectors["float"], "cosine")
    lines = [f"{name}: {n} texts, {len(upper[0])} pairs"]
    for encoding in ("int8", "uint8"):
        for metric in ("dot", "cosine"):
            sims = similarities(vectors[encoding], metric)
            rho = spearman(reference[upper], sims[upper])
            lines.append(
                f"  {encoding:5} {metric:6} spearman {rho:.4f}  "
                f"top10 {top_k_kept(reference, sims):.3f}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the mixed inputs' draw")
    args = parser.parse_args()
    sets = {
        "corpus sentences": list(sentences()),
        "mixed inputs": list(dict.fromkeys(mixed_inputs(256, seed=args.seed))),
    }
    port = free_port()
    with started(pipeline_server_command(), port, ready_timeout_s=600) as (base, _):
        for name, texts in sets.items():
            print("\n".join(report(name, embed(base, texts))))


if __name__ == "__main__":
    main()
