"""Memory-budgeted, resumable and sharded index builds; named index types; exact re-ranking.

Small corpora in tmp_path with the hashing encoder (32 or 64 dims, so FAISS trains in well
under a second); sharded builds run two CPU processes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
from test_index import CountingEncoder, write_corpus

from envs.retrieval import index_memory
from envs.retrieval.encoders import HashEncoder
from envs.retrieval.index import (
    EMBEDDINGS_FILE,
    INDEX_FILE,
    META_FILE,
    STATE_FILE,
    DenseIndex,
    MemoryBudgetError,
    build_index,
    resolve_index_type,
)
from envs.retrieval.index_build import fill_index, train_and_fill
from envs.retrieval.index_embed import EmbeddingsFile, auto_devices, done_prefix, shard_bounds
from envs.retrieval.index_memory import (
    ADD_COPIES,
    HEADROOM_MIN,
    INDEX_NAMES,
    TRAIN_COPIES,
    estimate_index_size,
    format_bytes,
)

ROOT = Path(__file__).resolve().parents[1]


class Crash(Exception):
    pass


def crash_after(rows: int):
    def on_batch(rows_done, total):
        if rows_done >= rows:
            raise Crash

    return on_batch


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """Tiny k-means runs are dominated by OpenMP spin-waits on a busy 2-core machine."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.jsonl", 120)


def same_index(a: Path, b: Path) -> bool:
    return np.array_equal(faiss.serialize_index(faiss.read_index(str(a / INDEX_FILE))),
                          faiss.serialize_index(faiss.read_index(str(b / INDEX_FILE))))


def meta_of(path: Path) -> dict:
    return json.loads((path / META_FILE).read_text())


# ----- budgeted builds -----------------------------------------------------------------------


def test_tiny_budget_gives_small_chunks_and_the_same_flat_index(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c.jsonl", 300)
    encoder = HashEncoder(64)
    free = build_index(corpus, encoder, tmp_path / "free", "Flat", batch_size=64, show_progress=False)
    monkeypatch.setattr(index_memory, "current_rss_bytes", lambda: 0)  # make the plan independent of pytest's RSS
    budget = HEADROOM_MIN + 300 * 256 + 80 * ADD_COPIES * 256  # the index plus a chunk of 80 rows
    tight = build_index(corpus, encoder, tmp_path / "tight", "Flat", batch_size=64, show_progress=False,
                        memory_budget=budget)
    plan = meta_of(tight)["build_plan"]
    assert plan["add_chunk"] == 80 and plan["encode_batch"] < 64
    assert meta_of(tight)["memory_budget_bytes"] == budget
    np.testing.assert_array_equal(np.load(free / EMBEDDINGS_FILE), np.load(tight / EMBEDDINGS_FILE))
    assert same_index(free, tight)


def test_tiny_budget_shrinks_the_training_sample(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c.jsonl", 400)
    monkeypatch.setattr(index_memory, "current_rss_bytes", lambda: 0)
    factory = resolve_index_type("ivfflat", 400, 32)
    fixed = estimate_index_size(factory, 32).fixed
    budget = HEADROOM_MIN + fixed + 200 * TRAIN_COPIES * 128  # room for a 200-row sample (and the index)
    out = build_index(corpus, HashEncoder(32), tmp_path / "idx", "ivfflat", show_progress=False, memory_budget=budget)
    meta = meta_of(out)
    assert meta["trained_on_rows"] == meta["build_plan"]["train_rows"] == 200
    index = DenseIndex.load(out, device="cpu")
    _, rows = index.search(HashEncoder(32).encode_queries(["blue heron number 10"]), 3)
    assert rows.shape == (1, 3) and (rows >= 0).all()


def test_impossible_budget_is_refused_before_encoding(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c.jsonl", 300)
    monkeypatch.setattr(index_memory, "current_rss_bytes", lambda: 0)
    counting = CountingEncoder(HashEncoder(512))
    estimate = estimate_index_size("Flat", 512).total(300)
    with pytest.raises(MemoryBudgetError) as err:
        build_index(corpus, counting, tmp_path / "idx", "flat", show_progress=False,
                    memory_budget=HEADROOM_MIN + 700_000)  # SQ8 (154 kB) and an add chunk fit, Flat not
    message = str(err.value)
    assert "Flat" in message and format_bytes(estimate) in message and "2,048 bytes/vector" in message
    assert "--index-type sq8 (SQ8: ~" in message and "Nothing was encoded" in message
    assert counting.passages_encoded == 0 and not (tmp_path / "idx" / EMBEDDINGS_FILE).exists()
    monkeypatch.setattr(index_memory, "current_rss_bytes", lambda: 10**9)
    with pytest.raises(MemoryBudgetError, match="below what this process already holds"):
        build_index(corpus, counting, tmp_path / "idx", "flat", show_progress=False, memory_budget="500MB")
    assert counting.passages_encoded == 0


def test_budget_is_checked_again_after_the_encoder_grew(tmp_path, corpus, monkeypatch):
    rss = {"now": 0}
    monkeypatch.setattr(index_memory, "current_rss_bytes", lambda: rss["now"])

    class Growing(CountingEncoder):  # an encoder whose caches take 1 GB while it encodes
        def encode_passages(self, passages, show_progress=None):
            rss["now"] = 10**9
            return super().encode_passages(passages)

    growing = Growing(HashEncoder(64))
    with pytest.raises(MemoryBudgetError, match="after encoding, this process holds"):
        build_index(corpus, growing, tmp_path / "idx", show_progress=False, memory_budget=HEADROOM_MIN + 10**6)
    assert growing.passages_encoded == 120 and not (tmp_path / "idx" / META_FILE).exists()
    rss["now"] = 0  # a fresh process
    again = CountingEncoder(HashEncoder(64))
    out = build_index(corpus, again, tmp_path / "idx", show_progress=False, memory_budget=HEADROOM_MIN + 10**6)
    assert again.passages_encoded == 0 and meta_of(out)["ntotal"] == 120


def test_meta_records_budget_and_peak_rss(tmp_path, corpus):
    out = build_index(corpus, HashEncoder(64), tmp_path / "idx", "sq8", show_progress=False, memory_budget="16GiB")
    meta = meta_of(out)
    assert meta["memory_budget"] == "16GiB" and meta["memory_budget_bytes"] == 16 << 30
    assert 10 << 20 < meta["peak_rss_bytes"] < 16 << 30
    assert meta["estimated_index_bytes"] == estimate_index_size("SQ8", 64).total(120)
    assert meta["bytes_per_vector"] == 64 and meta["build_plan"]["factory"] == "SQ8"
    unbudgeted = meta_of(build_index(corpus, HashEncoder(64), tmp_path / "free", show_progress=False))
    assert unbudgeted["memory_budget"] is None and unbudgeted["memory_budget_bytes"] is None
    assert unbudgeted["peak_rss_bytes"] > 0


def test_build_script_with_budget_devices_and_rerank_in_a_fresh_process(tmp_path, corpus):
    """A fresh interpreter, so getrusage's peak is this build's alone; also spawns two workers."""
    out = tmp_path / "cli"
    base = [sys.executable, str(ROOT / "scripts" / "build_index.py"), "--corpus", str(corpus.path),
            "--encoder", "hash:64", "--index-type", "ivfpq", "--quiet"]
    command = [*base, "--out", str(out), "--memory-budget", "1GiB", "--devices", "cpu,cpu", "--rerank", "30",
               "--nprobe", "4", "--batch-size", "16"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    meta = meta_of(out)
    assert meta["peak_rss_bytes"] <= meta["memory_budget_bytes"] == 1 << 30
    assert meta["rerank"] == 30 and meta["nprobe"] == 4 and meta["encode_devices"] == ["cpu", "cpu"]
    assert all(w["peak_rss_bytes"] < 1 << 30 for w in meta["encode_workers"])
    assert "peak RSS" in done.stdout
    refused = subprocess.run([*base, "--memory-budget", "1MB", "--out", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert refused.returncode == 2 and "refused" in refused.stderr and not (tmp_path / "no" / EMBEDDINGS_FILE).exists()


# ----- resume and shards ---------------------------------------------------------------------


def test_shard_bounds_and_done_prefix():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2)]
    states = [{"first_row": 0, "rows_done": 4}, {"first_row": 5, "rows_done": 8}, {"first_row": 4, "rows_done": 6}]
    assert done_prefix(0, 10, states) == 8 and done_prefix(8, 10, states) == 8 and done_prefix(5, 7, states) == 7


def test_two_processes_embed_exactly_like_one(tmp_path, corpus):
    single = build_index(corpus, HashEncoder(64), tmp_path / "single", "ivfpq", batch_size=16, show_progress=False)
    sharded = build_index(corpus, HashEncoder(64), tmp_path / "sharded", "ivfpq", batch_size=16, show_progress=False,
                          devices=["cpu", "cpu"])
    np.testing.assert_array_equal(np.load(single / EMBEDDINGS_FILE), np.load(sharded / EMBEDDINGS_FILE))
    assert same_index(single, sharded)
    meta = meta_of(sharded)
    assert meta["encode_devices"] == ["cpu", "cpu"] and meta["embedded_rows_this_run"] == 120
    assert ([(w["first_row"], w["stop_row"], w["rows_embedded"]) for w in meta["encode_workers"]]
            == [(0, 60, 60), (60, 120, 60)])
    assert json.loads((sharded / STATE_FILE).read_text())["rows_done"] == 120
    assert not list(sharded.glob("build_state.shard*.json"))  # folded into build_state.json when done


@pytest.mark.parametrize("devices", [None, ["cpu", "cpu"]], ids=["one-process", "two-processes"])
def test_interrupted_ivf_build_resumes_to_identical_index(tmp_path, devices):
    corpus = write_corpus(tmp_path / "c.jsonl", 1200)  # 75 batches per shard: workers cannot finish first
    partial = tmp_path / "partial"
    with pytest.raises(Crash):
        build_index(corpus, HashEncoder(64), partial, "ivfpq", batch_size=8, on_batch=crash_after(16),
                    show_progress=False, devices=devices)
    assert not (partial / META_FILE).exists()
    states = [json.loads(p.read_text()) for p in partial.glob("build_state*.json")]
    done = sum(s["rows_done"] - s["first_row"] for s in states)
    assert 16 <= done < 1200
    resumed = build_index(corpus, HashEncoder(64), partial, "ivfpq", batch_size=8, show_progress=False, devices=devices)
    assert meta_of(resumed)["embedded_rows_this_run"] == 1200 - done
    clean = build_index(corpus, HashEncoder(64), tmp_path / "clean", "ivfpq", batch_size=8, show_progress=False)
    np.testing.assert_array_equal(np.load(partial / EMBEDDINGS_FILE), np.load(clean / EMBEDDINGS_FILE))
    assert same_index(partial, clean)


def test_single_process_progress_is_reused_by_a_sharded_resume(tmp_path, corpus):
    out = tmp_path / "idx"
    with pytest.raises(Crash):
        build_index(corpus, HashEncoder(64), out, batch_size=8, on_batch=crash_after(40), show_progress=False)
    build_index(corpus, HashEncoder(64), out, batch_size=8, show_progress=False, devices=["cpu", "cpu"])
    meta = meta_of(out)
    assert meta["embedded_rows_this_run"] == 120 - 40  # shard 0 [0, 60) started at row 40
    assert meta["encode_workers"][0]["rows_embedded"] == 20
    clean = build_index(corpus, HashEncoder(64), tmp_path / "clean", show_progress=False)
    np.testing.assert_array_equal(np.load(out / EMBEDDINGS_FILE), np.load(clean / EMBEDDINGS_FILE))


def test_a_failing_worker_stops_the_build_with_its_error(tmp_path, corpus, monkeypatch):
    class Renamed(HashEncoder):  # the children rebuild "hash:64", which then does not match
        def __init__(self):
            super().__init__(64)
            self.settings = {"dtype": "float32"}

    with pytest.raises(RuntimeError, match="rebuilt a different encoder"):
        build_index(corpus, Renamed(), tmp_path / "idx", show_progress=False, devices=["cpu", "cpu"])
    assert not (tmp_path / "idx" / META_FILE).exists()


def test_auto_devices_only_for_cuda_encoders_on_large_corpora(monkeypatch):
    class FakeCuda:
        @staticmethod
        def device_count():
            return 3

    class FakeTorch:
        cuda = FakeCuda

    monkeypatch.setitem(sys.modules, "torch", FakeTorch)
    gpu_encoder = type("E", (), {"device": "cuda:0"})()
    assert auto_devices(gpu_encoder, 200_000) == ["cuda:0", "cuda:1", "cuda:2"]
    assert auto_devices(gpu_encoder, 5_000) is None  # not worth three model loads
    assert auto_devices(HashEncoder(), 200_000) is None


def test_embeddings_file_reads_and_writes_rows_without_a_map(tmp_path):
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    with EmbeddingsFile.create(tmp_path / "e.npy", (10, 4)) as file:
        file.write(3, rows[3:7])
        file.write(0, rows[:3])
        file.write(7, rows[7:])
        file.sync()
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), rows)
    with EmbeddingsFile(tmp_path / "e.npy") as file:
        np.testing.assert_array_equal(file.read(2, 5), rows[2:5])
        np.testing.assert_array_equal(file.take([0, 1, 2, 6, 9]), rows[[0, 1, 2, 6, 9]])
        with pytest.raises(ValueError):
            file.take([3, 1])


@pytest.mark.parametrize("factory", ["Flat", "SQ8", "IVF8,Flat", "IVF8,PQ8x4", "OPQ8,IVF8,PQ8x4", "IVF8,SQfp16"])
def test_reserved_fill_equals_plain_adds(factory):
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((900, 32)).astype(np.float32)
    faiss.normalize_L2(vectors)
    reserved, _ = train_and_fill(vectors, factory, train_size=900, add_chunk=250)
    plain = faiss.index_factory(32, factory, faiss.METRIC_INNER_PRODUCT)
    if not plain.is_trained:
        plain = faiss.deserialize_index(faiss.serialize_index(reserved))
        plain.reset()
    for start in range(0, 900, 250):
        plain.add(vectors[start:start + 250])
    assert reserved.ntotal == plain.ntotal == 900
    np.testing.assert_array_equal(faiss.serialize_index(reserved), faiss.serialize_index(plain))
    again = faiss.deserialize_index(faiss.serialize_index(reserved))
    again.reset()
    fill_index(again, vectors, add_chunk=900)  # one chunk or four: the same index
    np.testing.assert_array_equal(faiss.serialize_index(again), faiss.serialize_index(plain))


# ----- named types and re-ranking ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INDEX_NAMES))
def test_each_named_type_builds_and_searches(tmp_path, name):
    corpus = write_corpus(tmp_path / "c.jsonl", 300)
    encoder = HashEncoder(32)
    out = build_index(corpus, encoder, tmp_path / "idx", name, show_progress=False, nprobe=4)
    meta = meta_of(out)
    assert meta["factory"] == resolve_index_type(name, 300, 32) and meta["index_type"] == name and meta["ntotal"] == 300
    index = DenseIndex.load(out, corpus=corpus, device="cpu")
    assert index.nprobe == (None if "IVF" not in meta["factory"] else min(4, faiss.extract_index_ivf(
        faiss.read_index(str(out / INDEX_FILE))).nlist))
    scores, rows = index.search(encoder.encode_queries(["green lynx number 17", "white walrus"]), 5)
    assert rows.shape == scores.shape == (2, 5) and np.all((rows >= 0) & (rows < 300))
    assert np.all(np.diff(scores, axis=1) <= 1e-5)
    vectors = encoder.encode_passages(corpus.get_many(range(300)))
    top1 = np.mean(index.search(vectors, 1)[1][:, 0] == np.arange(300))
    assert top1 >= (0.9 if "PQ" not in meta["factory"] else 0.3)


class RandomEncoder:
    """Unit vectors drawn from each passage's row number: a random set with no ties."""

    name, dim, settings = "random-test", 32, {}

    def encode_passages(self, passages, show_progress=None):
        vectors = np.stack([np.random.default_rng(p.row).standard_normal(self.dim) for p in passages])
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("index_type, nprobe", [("IVF4,PQ8", 4), ("ivfpq", 64), ("opq-ivfpq", 64)])
def test_rerank_brings_a_pq_index_to_exact_recall(tmp_path, index_type, nprobe):
    corpus = write_corpus(tmp_path / "c.jsonl", 800)
    encoder = RandomEncoder()
    exact = DenseIndex.load(build_index(corpus, encoder, tmp_path / "flat", show_progress=False), device="cpu")
    out = build_index(corpus, encoder, tmp_path / "pq", index_type, show_progress=False, nprobe=nprobe, rerank=100)
    assert meta_of(out)["rerank"] == 100
    queries = np.random.default_rng(99).standard_normal((50, 32)).astype(np.float32)
    truth = exact.search(queries, 10)[1]

    def recall(index):
        rows = index.search(queries, 10)[1]
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, truth)])

    plain = DenseIndex.load(out, device="cpu", rerank=0)
    reranked = DenseIndex.load(out, device="cpu")  # rerank=100 from meta.json
    assert plain.rerank == 0 and reranked.rerank == 100
    assert recall(plain) < 0.95 and recall(reranked) >= 0.99
    scores, rows = reranked.search(queries[:3], 10)
    stored = np.load(out / EMBEDDINGS_FILE)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries[:3], stored[rows]), rtol=1e-5)  # exact scores


def test_rerank_keeps_shape_and_padding(tmp_path):
    corpus = write_corpus(tmp_path / "tiny.jsonl", 3)
    encoder = HashEncoder(32)
    out = build_index(corpus, encoder, tmp_path / "idx", "Flat", show_progress=False, rerank=10)
    index = DenseIndex.load(out, device="cpu")
    scores, rows = index.search(encoder.encode_queries(["red otter", "green heron"]), 5)
    assert rows.shape == scores.shape == (2, 5) and rows.dtype == np.int64 and scores.dtype == np.float32
    assert (rows[:, 3:] == -1).all() and np.isneginf(scores[:, 3:]).all()
    assert sorted(rows[0, :3]) == [0, 1, 2]
    assert index.search(np.zeros((0, 32), np.float32), 5)[1].shape == (0, 5)
    k_above = DenseIndex.load(out, device="cpu").search(encoder.encode_queries(["red otter"]), 12)[1]
    assert k_above.shape == (1, 12) and (k_above[0, 3:] == -1).all()  # rerank <= k: plain search


def test_rerank_is_updated_without_rebuilding_and_needs_the_embeddings(tmp_path, corpus):
    out = build_index(corpus, HashEncoder(32), tmp_path / "idx", "ivfpq", show_progress=False)
    assert meta_of(out)["rerank"] == 0 and DenseIndex.load(out, device="cpu").rerank == 0
    counting = CountingEncoder(HashEncoder(32))
    build_index(corpus, counting, out, "ivfpq", show_progress=False, rerank=40, nprobe=2)
    assert counting.passages_encoded == 0 and meta_of(out)["rerank"] == 40 and meta_of(out)["nprobe"] == 2
    assert DenseIndex.load(out, device="cpu", rerank=7).rerank == 7
    (out / EMBEDDINGS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="rerank=0"):
        DenseIndex.load(out, device="cpu")
    assert DenseIndex.load(out, device="cpu", rerank=0).rerank == 0
