"""scripts/bench_index.py on a tiny size (3,000 x 32): generator, ground truth, recall and one full run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_index as bench  # noqa: E402

N, DIM = 3000, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "vectors.npy"
    config = bench.GeneratorConfig(dim=DIM, seed=3, clusters=50, latent_dim=8)
    assert bench.generate(path, N, config)
    return path, config


def test_generator_is_seeded_normalised_and_reused(data, tmp_path):
    path, config = data
    rows = np.load(path)
    assert rows.shape == (N, DIM) and rows.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    assert not bench.generate(path, N, config)  # same data asked for: reused, not rewritten

    again = tmp_path / "again.npy"
    bench.generate(again, N, config)
    assert again.read_bytes() == path.read_bytes()
    other = tmp_path / "other.npy"
    bench.generate(other, N, bench.GeneratorConfig(dim=DIM, seed=4, clusters=50, latent_dim=8))
    assert not np.allclose(np.load(other), rows)

    queries = bench.make_queries(20, config)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, rtol=1e-5)
    assert (queries @ rows.T).max() < 0.9999  # fresh draws, not copies of base rows
    reader = bench.RowReader(path)
    assert (reader.n, reader.dim) == (N, DIM)
    np.testing.assert_array_equal(reader.rows(100, 200), rows[100:200])
    picked = np.array([0, 5, 700, 2999])
    np.testing.assert_array_equal(reader.take(picked), rows[picked])


def test_exact_top_k_and_recall(data):
    path, config = data
    rows = np.load(path)
    queries = bench.make_queries(15, config)
    truth = bench.exact_top_k(bench.RowReader(path), queries, 10)
    expected = np.argsort(-(queries @ rows.T), axis=1)[:, :10]
    np.testing.assert_array_equal(truth, expected)
    subset = bench.exact_top_k(bench.RowReader(path), queries, 10, stop=1000)
    assert subset.max() < 1000

    found = truth.copy()
    found[0, :5] = -1  # half of query 0's neighbours missed
    assert bench.recall_at_k(truth, truth) == 1.0
    assert bench.recall_at_k(found, truth) == pytest.approx(1 - 0.5 / len(truth))


def test_defaults_and_options():
    assert bench.default_nlist(1_000_000) == 4096
    assert bench.default_nlist(3000) * 39 <= 3000
    assert bench.parse_args([]).hnsw_n is None  # HNSW on every row unless asked otherwise
    args = bench.parse_args(["--types", "opq32+rerank, flat, ivf-pq32+rerank50", "--rerank", "100,300"])
    assert args.types == ["opq32+rerank100", "opq32+rerank300", "flat", "ivf-pq32+rerank50"]
    assert args.rerank == [100, 300] and bench.rerank_depth("opq32+rerank300") == 300
    assert bench.parse_args(["--types", "opq32+rerank,flat", "--rerank", "0"]).types == ["flat"]
    for bad in ("flat+rerank", "ivf-pq32+rerankX", "IVF64,Flat"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--types", bad])
    assert bench.pq_fits("OPQ48,IVF64,PQ48", 768) and not bench.pq_fits("IVF64,PQ64", 96)


def test_full_run_tiny(tmp_path, capsys):
    out = tmp_path / "results.json"
    types = "flat,hnsw32,ivf-flat,ivf-sq16,ivf-pq32,opq32,ivf-pq64,ivf-pq32+rerank,opq32+rerank"
    result = bench.main([
        "--n", str(N), "--dim", str(DIM), "--queries", "50", "--types", types, "--hnsw-n", "2000",
        "--rerank", "100,300", "--nprobe", "8", "--opq-iters", "4", "--batch1-queries", "10",
        "--flat-batch1-queries", "5",
        "--clusters", "50", "--latent-dim", "8", "--workdir", str(tmp_path / "work"), "--out", str(out),
    ])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {row["name"]: row for row in result["rows"]}
    assert result["skipped"] == ["ivf-pq64"]  # 64 does not divide 32
    assert list(rows) == ["flat", "hnsw32", "ivf-flat", "ivf-sq16", "ivf-pq32", "ivf-pq32+rerank100",
                          "ivf-pq32+rerank300", "opq32", "opq32+rerank100", "opq32+rerank300"]

    flat = rows["flat"]
    assert flat["recall10"] == 1.0
    assert flat["bytes_per_vector"] == pytest.approx(4 * DIM, rel=0.01)
    assert flat["wiki_gb"] == pytest.approx(4 * DIM * bench.WIKIPEDIA_PASSAGES / 1e9, rel=0.01)
    assert rows["hnsw32"]["rows_indexed"] == 2000 and "first 2000" in rows["hnsw32"]["note"]
    assert rows["ivf-sq16"]["bytes_per_vector"] < 0.6 * rows["ivf-flat"]["bytes_per_vector"]
    for name in ("ivf-pq32", "opq32"):
        pq, shallow, deep = rows[name], rows[name + "+rerank100"], rows[name + "+rerank300"]
        assert 32 + 8 <= pq["bytes_per_vector"] < flat["bytes_per_vector"] / 2  # codes + int64 ids + fixed
        assert pq["bytes_per_vector"] == deep["bytes_per_vector"]  # the float32 file is not RAM
        assert pq["recall10"] <= shallow["recall10"] <= deep["recall10"]
        assert deep["recall10"] <= rows["ivf-flat"]["recall10"] + 1e-9  # same lists probed: IVF-Flat is the ceiling
    for row in rows.values():
        assert 0 < row["recall10"] <= 1 and row["build_seconds"] > 0 and row["peak_rss_mb"] >= 0
        assert all(row["qps"][str(b)] > 0 for b in bench.BATCH_SIZES)

    within = [r["recall10"] for r in rows.values() if r["bytes_per_vector"] <= bench.RAM_BUDGET_BYTES]
    assert result["best_recall10_at_64B"] == max(within)
    assert lines[-1] == f"best_recall10_at_64B={max(within):.4f}"
    assert any(line.startswith("winner within 64 B/vector: ") for line in lines)
    assert json.loads(out.read_text())["best_recall10_at_64B"] == result["best_recall10_at_64B"]
