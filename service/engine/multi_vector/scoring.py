"""Late-interaction scores: MaxSim and MeanMaxSim of a query's token vectors against each
document's, as sentence-transformers' `util.similarity.maxsim` computes them (the
`MultiVectorEncoder.similarity` of the folder's `similarity_fn_name`).

    maxsim(q, d)     = sum over query tokens i of max over document tokens j of q_i . d_j
    meanmaxsim(q, d) = maxsim(q, d) / (query tokens)

(Khattab and Zaharia, ColBERT, SIGIR 2020, eq. 3.) No activation: the score is the
similarity. A document with no token vector scores -1e9 (sentence-transformers' sentinel:
below every real document). float32, as sentence-transformers accumulates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EMPTY_DOCUMENT_SCORE = -1e9


def late_interaction(
    query: np.ndarray, documents: Sequence[np.ndarray], similarity: str
) -> list[float]:
    """Each document's score against `query` ([q, D] float32; documents [n_i, D] each) by
    `similarity` ("maxsim" or "meanmaxsim")."""
    q = np.asarray(query, dtype=np.float32)
    out = []
    for document in documents:
        d = np.asarray(document, dtype=np.float32)
        score = float((q @ d.T).max(axis=1).sum()) if len(d) else EMPTY_DOCUMENT_SCORE
        if similarity == "meanmaxsim":
            score /= max(len(q), 1)
        out.append(score)
    return out
