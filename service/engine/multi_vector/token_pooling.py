"""Token pooling: a document's token vectors merged by Ward clustering, as sentence-transformers'
`HierarchicalTokenPooling` (multi_vector_encoder/modules/token_pooling.py) and PyLate's
`pool_embeddings_hierarchical` compute it (Clavié et al., 2024, "Reducing the Footprint of
Multi-Vector Retrieval with Minimal Performance Impact via Token Pooling"). numpy only.

For one answer's rows E [n, D] (float32):

1. the first `protected_tokens` rows ([CLS], usually) are kept as they are;
2. the other m rows are clustered: distances `clip(1 - E E^T, 0, 2)` (cosine distance of
   normalized rows, float32), Ward linkage on them (scipy's `linkage(method="ward")`: the
   Lance-Williams update in float64), the tree cut into `max(m // pool_factor, 1)` clusters
   (`fcluster(criterion="maxclust")`; `max_tokens`: that many rows in all; a
   `distance_threshold`: `criterion="distance"`); unchanged when that leaves m rows;
3. each cluster is replaced by the float32 mean of its rows, clusters in fcluster's numbering
   (`_flat_clusters`); the answer is the protected rows, then the means, L2-normalized (every
   row) with `normalize`.

Equal ties between distances may be broken in another order than scipy's (the clusters can
then differ, as sentence-transformers says of fastcluster against scipy).
"""

from __future__ import annotations

import numpy as np

from service.engine.multi_vector.config import TokenPooling


def pool(rows: np.ndarray, pooling: TokenPooling) -> np.ndarray:
    """One answer's rows [n, D] pooled as `pooling` says: [protected + clusters, D] float32."""
    rows = np.asarray(rows, dtype=np.float32)
    protected = min(pooling.protected_tokens, len(rows))
    kept, rest = rows[:protected], rows[protected:]
    target = _clusters(len(rest), pooling)
    if target is not None or pooling.distance_threshold is not None:
        labels = _labels(rest, target, pooling.distance_threshold)
        if labels is not None:
            sums = np.zeros((int(labels.max()) + 1, rows.shape[1]), dtype=np.float32)
            np.add.at(sums, labels, rest)
            counts = np.bincount(labels).astype(np.float32)
            rest = sums / counts[:, None]
    out = np.concatenate([kept, rest]) if len(kept) else rest
    if pooling.normalize:
        norms = np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        out = out / norms
    return out.astype(np.float32, copy=False)


def _clusters(m: int, pooling: TokenPooling) -> int | None:
    """How many clusters `m` poolable rows become, or None where nothing is pooled."""
    if pooling.distance_threshold is not None:
        return None
    if pooling.max_tokens is not None:
        target = pooling.max_tokens - pooling.protected_tokens
    elif pooling.pool_factor <= 1:
        return None
    else:
        target = int(m // pooling.pool_factor)
    target = min(max(target, 1), m)
    return None if m <= 1 or target >= m else target


def _labels(rows: np.ndarray, target: int | None, threshold: float | None) -> np.ndarray | None:
    """Zero-based cluster labels of `rows` [m, D] (fcluster's numbering, made dense), or None
    for fewer than two rows."""
    m = len(rows)
    if m <= 1:
        return None
    distances = np.clip(np.float32(1) - rows @ rows.T, 0, 2).astype(np.float64)
    merges, heights = ward_linkage(distances)
    tops = np.maximum.accumulate(heights)  # scipy's max distance below each node
    if threshold is None:
        assert target is not None
        cutoff = np.sort(tops)[m - target - 1]
    else:
        cutoff = threshold
    labels = _flat_clusters(merges, tops, cutoff, m)
    return np.unique(labels, return_inverse=True)[1].reshape(-1)


def ward_linkage(distances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ward's agglomerative clustering of m points from their pairwise distances [m, m]: the
    m - 1 merges [m - 1, 2] (the two clusters' ids, smaller first; leaves 0..m-1, the k-th
    merge's cluster m + k) and their heights [m - 1], lowest first, as scipy's `linkage`
    numbers them. Each step merges the closest pair; the merged cluster's distance to every
    other cluster k is Lance-Williams' Ward update (scipy's `_hierarchy_distance_update`):

        d(k, x+y) = sqrt(((s_k + s_x) d(k,x)^2 + (s_k + s_y) d(k,y)^2 - s_k d(x,y)^2)
                         / (s_k + s_x + s_y))

    Ward's update is reducible, so the closest pair's distance never decreases: each row's
    nearest neighbour is kept and only rows whose neighbour merged are searched again."""
    m = len(distances)
    d = np.array(distances, dtype=np.float64)
    np.fill_diagonal(d, np.inf)
    size = np.ones(m)
    ids = np.arange(m)
    nearest = np.argmin(d, axis=1)
    nearest_d = d[np.arange(m), nearest]
    merges = np.empty((m - 1, 2), dtype=np.int64)
    heights = np.empty(m - 1)
    for step in range(m - 1):
        x = int(np.argmin(nearest_d))
        y = int(nearest[x])
        dxy = d[x, y]
        merges[step] = sorted((ids[x], ids[y]))
        heights[step] = dxy
        t = 1.0 / (size + size[x] + size[y])
        row = np.sqrt(
            np.maximum(
                (size + size[x]) * t * d[x] * d[x]
                + (size + size[y]) * t * d[y] * d[y]
                - size * t * dxy * dxy,
                0.0,
            )
        )
        row[[x, y]] = np.inf
        alive = np.isfinite(nearest_d)
        row[~alive] = np.inf
        d[x], d[:, x] = row, row
        d[y], d[:, y] = np.inf, np.inf
        size[x] += size[y]
        ids[x] = m + step
        nearest_d[y] = np.inf
        stale = alive & ((nearest == x) | (nearest == y))
        stale[[x, y]] = True
        stale[y] = False
        for k in np.flatnonzero(stale):
            nearest[k] = int(np.argmin(d[k]))
            nearest_d[k] = d[k, nearest[k]]
        closer = alive & (row < nearest_d)
        nearest[closer], nearest_d[closer] = x, row[closer]
    return merges, heights


def _flat_clusters(merges: np.ndarray, tops: np.ndarray, cutoff: float, m: int) -> np.ndarray:
    """scipy's `fcluster` numbering (`cluster_monocrit`): the tree walked from its root; at a
    node, its merged children first (first child first), then its leaf children; the first node
    on the way down whose max distance is at most `cutoff` is one cluster, numbered when it is
    reached; a leaf outside every such node is its own cluster, numbered when it is reached."""
    labels = np.zeros(m, dtype=np.int64)
    number = 0
    leader = -1
    stack = [(2 * m - 2, False)]  # (node, its merged children done)
    while stack:
        node, done = stack.pop()
        children = [int(c) for c in merges[node - m]]
        if not done:
            if leader == -1 and tops[node - m] <= cutoff:
                leader = node
                number += 1
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children) if c >= m)
            continue
        for leaf in (c for c in children if c < m):
            if leader == -1:
                number += 1
            labels[leaf] = number
        if leader == node:
            leader = -1
    return labels
