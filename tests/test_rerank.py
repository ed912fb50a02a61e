"""Exact re-ranking of candidate rows against (memory-mapped) embeddings."""
import numpy as np

from envs.retrieval.rerank import rerank_exact


def test_rerank_orders_candidates_by_exact_score(tmp_path):
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(50, 8)).astype(np.float32)
    np.save(tmp_path / "e.npy", embeddings)
    memmap = np.load(tmp_path / "e.npy", mmap_mode="r")
    queries = rng.normal(size=(3, 8)).astype(np.float32)
    candidates = np.array([[4, 9, 17, 30, 2], [1, 1, 5, -1, -1], [-1, -1, -1, -1, -1]])
    scores, rows = rerank_exact(memmap, queries, candidates, k=3)
    exact0 = embeddings[[4, 9, 17, 30, 2]] @ queries[0]
    order = np.argsort(-exact0)[:3]
    assert rows[0].tolist() == [[4, 9, 17, 30, 2][i] for i in order]
    np.testing.assert_allclose(scores[0], exact0[order], rtol=1e-5)
    assert sorted(rows[1][:2].tolist()) == [1, 5] and rows[1][2] == -1 and scores[1][2] == -np.inf  # duplicate once
    assert rows[2].tolist() == [-1, -1, -1]


def test_rerank_recovers_exact_top_k_when_candidates_cover_it():
    rng = np.random.default_rng(1)
    embeddings = rng.normal(size=(200, 16)).astype(np.float32)
    queries = rng.normal(size=(5, 16)).astype(np.float32)
    exact = np.argsort(-(queries @ embeddings.T), axis=1)
    candidates = np.concatenate([exact[:, :10][:, ::-1], rng.integers(0, 200, size=(5, 20))], axis=1)
    _, rows = rerank_exact(embeddings, queries, candidates, k=10)
    assert (rows == exact[:, :10]).all()
