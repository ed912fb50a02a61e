"""Exact re-ranking of approximate candidates from the embeddings file on disk.

A compressed index (IVF-PQ, OPQ-IVF-PQ, ...) keeps a few dozen bytes per vector in RAM and
returns approximate scores. Asking it for ``k' > k`` candidates and re-scoring them exactly
against the float32 embeddings kept in ``embeddings.npy`` (memory-mapped: only the candidate
rows are read from disk) restores most of the recall of an exact search at the RAM cost of the
compressed index.
"""
from __future__ import annotations

import numpy as np


def rerank_exact(embeddings: np.ndarray, queries: np.ndarray, candidates: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` among each query's candidate rows.

    ``embeddings``: (n, d) float32, usually a read-only ``np.memmap``;
    ``queries``: (q, d) float32; ``candidates``: (q, c) int64 rows, -1 for "none".
    Returns ``(scores (q, k) float32, rows (q, k) int64)``, best first; where fewer than ``k``
    valid candidates exist, rows are -1 and scores -inf. Duplicate candidates count once.
    """
    queries = np.asarray(queries, dtype=np.float32)
    candidates = np.asarray(candidates, dtype=np.int64)
    n_queries, n_candidates = candidates.shape
    out_scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
    out_rows = np.full((n_queries, k), -1, dtype=np.int64)
    valid = candidates >= 0
    if not valid.any():
        return out_scores, out_rows
    wanted = np.unique(candidates[valid])  # sorted: sequential reads from the memmap
    vectors = np.asarray(embeddings[wanted], dtype=np.float32)  # (u, d)
    position = np.searchsorted(wanted, np.where(valid, candidates, wanted[0]))  # (q, c)
    scores = np.einsum("qd,qcd->qc", queries, vectors[position])  # (q, c)
    scores[~valid] = -np.inf
    for i in range(n_queries):  # drop duplicate candidates of one query before taking the top-k
        _, first = np.unique(candidates[i], return_index=True)
        keep = np.zeros(n_candidates, dtype=bool)
        keep[first] = True
        scores[i, ~keep] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (q, min(k, c))
    width = top.shape[1]
    out_scores[:, :width] = np.take_along_axis(scores, top, axis=1)
    out_rows[:, :width] = np.where(np.isfinite(out_scores[:, :width]), np.take_along_axis(candidates, top, axis=1), -1)
    return out_scores, out_rows
