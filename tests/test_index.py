"""Index build and search with the hashing encoder over small corpora written to tmp_path."""
from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import HashEncoder
from envs.retrieval.index import (
    EMBEDDINGS_FILE,
    INDEX_FILE,
    META_FILE,
    STATE_FILE,
    DenseIndex,
    IndexMismatchError,
    build_index,
    resolve_index_type,
)

COLOURS = ["red", "green", "blue", "amber", "violet", "silver", "black", "white"]
ANIMALS = ["otter", "heron", "lynx", "badger", "falcon", "newt", "bison", "gecko", "walrus", "ibis"]


def write_corpus(path, n: int, salt: str = ""):
    """JSONL corpus of ``n`` passages whose word combinations are all distinct."""
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(n):
            colour, animal = COLOURS[i % len(COLOURS)], ANIMALS[(i // len(COLOURS)) % len(ANIMALS)]
            text = f"The {colour} {animal} number {i} {salt} lives near lake {i * 7 % 101} and eats item{i}."
            handle.write(json.dumps({"id": f"d{i}", "title": f"{colour} {animal} {i}", "text": text}) + "\n")
    return load_corpus(path)


class CountingEncoder:
    """Wraps an encoder and counts the passages it embeds."""

    def __init__(self, inner):
        self.inner, self.name, self.dim, self.settings = inner, inner.name, inner.dim, inner.settings
        self.passages_encoded = 0

    def encode_queries(self, texts, show_progress=None):
        return self.inner.encode_queries(texts)

    def encode_passages(self, passages, show_progress=None):
        self.passages_encoded += len(passages)
        return self.inner.encode_passages(passages)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.jsonl", 60)


def self_top1(index: DenseIndex, corpus, encoder) -> float:
    """Fraction of passages whose own embedding retrieves them first."""
    vectors = encoder.encode_passages(corpus.get_many(range(len(corpus))))
    _, rows = index.search(vectors, 1)
    return float(np.mean(rows[:, 0] == np.arange(len(corpus))))


def test_flat_is_exact_self_retrieval(tmp_path, corpus):
    encoder = HashEncoder()
    out = build_index(corpus, encoder, tmp_path / "idx", "Flat", batch_size=16, show_progress=False)
    index = DenseIndex.load(out, corpus=corpus, device="cpu")
    assert index.backend == "faiss-cpu" and len(index) == 60
    assert self_top1(index, corpus, encoder) == 1.0
    scores, rows = index.search(encoder.encode_queries(["the violet otter number 4"]), 3)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (1, 3)
    assert rows[0, 0] == 4 and np.all(np.diff(scores[0]) <= 0)
    assert -1.0 - 1e-5 <= scores.min() and scores.max() <= 1.0 + 1e-5  # cosine, not a distance


def test_meta_records_the_build(tmp_path, corpus):
    out = build_index(corpus, HashEncoder(), tmp_path / "idx", "flat", show_progress=False)
    meta = json.loads((out / META_FILE).read_text())
    assert meta["encoder"] == "hash" and meta["dim"] == 512
    assert meta["corpus_path"] == str(corpus.path.resolve())
    assert meta["corpus_fingerprint"] == corpus.fingerprint() and meta["corpus_size"] == 60
    assert meta["index_type"] == "flat" and meta["factory"] == "Flat"
    assert meta["faiss_version"] == faiss.__version__ and meta["ntotal"] == 60
    assert (out / INDEX_FILE).is_file()
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize("index_type", ["HNSW32", "IVF4,PQ16x4", "hnsw", "ivfpq"])
def test_approximate_types_build_and_search(tmp_path, index_type):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 300)
    encoder = HashEncoder()
    out = build_index(corpus, encoder, tmp_path / "idx", index_type, show_progress=False)
    meta = json.loads((out / META_FILE).read_text())
    assert meta["factory"] == resolve_index_type(index_type, 300, 512)
    index = DenseIndex.load(out, corpus=corpus, device="cpu")
    scores, rows = index.search(encoder.encode_queries(["green lynx number 17", "white walrus"]), 5)
    assert rows.shape == (2, 5) and np.all((rows >= 0) & (rows < 300))
    assert np.all(np.diff(scores, axis=1) <= 1e-5)
    expected = 0.95 if "HNSW" in meta["factory"] else 0.8  # PQ codes are lossy
    assert self_top1(index, corpus, encoder) >= expected


def test_named_types_scale_with_the_corpus():
    assert resolve_index_type("flat", 10, 384) == "Flat"
    assert resolve_index_type("hnsw", 10, 384) == "HNSW32"
    assert resolve_index_type("ivfpq", 12_000, 384) == "IVF307,PQ64"
    assert resolve_index_type("ivfpq", 21_000_000, 768) == "IVF18330,PQ64"
    assert resolve_index_type("ivfpq", 300, 512) == "IVF7,PQ64x2"
    assert resolve_index_type("IVF1024,PQ16", 5, 384) == "IVF1024,PQ16"  # factory strings pass through


def test_refuses_another_corpus(tmp_path, corpus):
    out = build_index(corpus, HashEncoder(), tmp_path / "idx", show_progress=False)
    other = write_corpus(tmp_path / "other.jsonl", 60, salt="changed")
    with pytest.raises(IndexMismatchError) as err:
        DenseIndex.load(out, corpus=other)
    message = str(err.value)
    assert str(other.path) in message and str(corpus.path.resolve()) in message
    assert other.fingerprint()[:16] in message and corpus.fingerprint()[:16] in message


def test_interrupted_build_resumes_to_identical_index(tmp_path, corpus):
    class Crash(Exception):
        pass

    def crash_after_two_batches(rows_done, total):
        if rows_done >= 16:
            raise Crash

    partial = tmp_path / "partial"
    with pytest.raises(Crash):
        build_index(corpus, HashEncoder(), partial, batch_size=8, on_batch=crash_after_two_batches, show_progress=False)
    assert json.loads((partial / STATE_FILE).read_text())["rows_done"] == 16
    assert not (partial / META_FILE).exists()
    streamed = np.load(partial / EMBEDDINGS_FILE, mmap_mode="r")
    first_rows = HashEncoder().encode_passages(corpus.get_many(range(16)))
    np.testing.assert_array_equal(streamed[:16], first_rows)  # already on disk before the crash

    counting = CountingEncoder(HashEncoder())
    build_index(corpus, counting, partial, batch_size=8, show_progress=False)
    assert counting.passages_encoded == 60 - 16

    clean = build_index(corpus, HashEncoder(), tmp_path / "clean", batch_size=8, show_progress=False)
    np.testing.assert_array_equal(np.load(partial / EMBEDDINGS_FILE), np.load(clean / EMBEDDINGS_FILE))
    resumed = faiss.serialize_index(faiss.read_index(str(partial / INDEX_FILE)))
    fresh = faiss.serialize_index(faiss.read_index(str(clean / INDEX_FILE)))
    np.testing.assert_array_equal(resumed, fresh)


def test_complete_index_and_stored_embeddings_are_reused(tmp_path, corpus):
    out = build_index(corpus, HashEncoder(), tmp_path / "idx", show_progress=False)
    counting = CountingEncoder(HashEncoder())
    build_index(corpus, counting, out, show_progress=False)
    assert counting.passages_encoded == 0  # complete: nothing to do
    build_index(corpus, counting, out, index_type="HNSW32", show_progress=False)
    assert counting.passages_encoded == 0  # new type built from embeddings.npy
    assert json.loads((out / META_FILE).read_text())["factory"] == "HNSW32"
    build_index(corpus, counting, out, index_type="HNSW32", resume=False, show_progress=False)
    assert counting.passages_encoded == 60


def test_embeddings_live_in_a_memmap_file(tmp_path, corpus):
    encoder = HashEncoder()
    out = build_index(corpus, encoder, tmp_path / "idx", batch_size=7, show_progress=False)
    stored = np.load(out / EMBEDDINGS_FILE, mmap_mode="r")
    assert isinstance(stored, np.memmap) and stored.shape == (60, 512) and stored.dtype == np.float32
    np.testing.assert_array_equal(stored, encoder.encode_passages(corpus.get_many(range(60))))


def test_k_beyond_corpus_is_padded(tmp_path):
    corpus = write_corpus(tmp_path / "tiny.jsonl", 3)
    encoder = HashEncoder()
    index = DenseIndex.load(build_index(corpus, encoder, tmp_path / "idx", show_progress=False), device="cpu")
    scores, rows = index.search(encoder.encode_queries(["red otter"]), 5)
    assert list(rows[0, 3:]) == [-1, -1] and np.all(np.isneginf(scores[0, 3:]))
    assert sorted(rows[0, :3]) == [0, 1, 2]


def test_bad_queries_are_rejected(tmp_path, corpus):
    index = DenseIndex.load(build_index(corpus, HashEncoder(), tmp_path / "idx", show_progress=False))
    with pytest.raises(ValueError):
        index.search(np.zeros((1, 7), np.float32), 3)
    with pytest.raises(ValueError):
        index.search(np.zeros((1, 512), np.float32), 0)
    with pytest.raises(FileNotFoundError):
        DenseIndex.load(tmp_path / "nowhere")


def test_torch_searcher_matches_faiss_across_chunks(tmp_path, corpus):
    """The CUDA fallback's chunked top-k merge, run on CPU: same rows as exact faiss."""
    from envs.retrieval.index import _TorchFlatSearcher

    encoder = HashEncoder()
    out = build_index(corpus, encoder, tmp_path / "idx", show_progress=False)
    queries = encoder.encode_queries(["red otter number 0", "blue lynx", "item59"])
    searcher = _TorchFlatSearcher(np.load(out / EMBEDDINGS_FILE, mmap_mode="r"), device="cpu", chunk_rows=7)
    torch_scores, torch_rows = searcher.search(queries, 4)
    faiss_scores, faiss_rows = DenseIndex.load(out, device="cpu").search(queries, 4)
    np.testing.assert_array_equal(torch_rows[:, 0], faiss_rows[:, 0])
    np.testing.assert_allclose(torch_scores, faiss_scores, atol=2e-3)  # fp16 matrix


def test_device_auto_picks_torch_for_flat_when_faiss_has_no_gpu(tmp_path, corpus, monkeypatch):
    import envs.retrieval.index as index_module

    real_searcher = index_module._TorchFlatSearcher
    monkeypatch.setattr(index_module, "_faiss_gpus", lambda: 0)
    monkeypatch.setattr(index_module, "_torch_cuda", lambda: True)
    monkeypatch.setattr(index_module, "_TorchFlatSearcher", lambda emb: real_searcher(emb, device="cpu"))
    flat = build_index(corpus, HashEncoder(), tmp_path / "flat", show_progress=False)
    loaded = DenseIndex.load(flat)
    assert loaded.backend == "torch-cuda"
    _, rows = loaded.search(HashEncoder().encode_queries(["item7"]), 2)
    assert rows[0, 0] == 7
    assert DenseIndex.load(flat, device="cpu").backend == "faiss-cpu"
    hnsw = build_index(corpus, HashEncoder(), tmp_path / "hnsw", "HNSW32", show_progress=False)
    assert DenseIndex.load(hnsw).backend == "faiss-cpu"  # torch path is exact search: Flat only
    with pytest.raises(RuntimeError):
        DenseIndex.load(hnsw, device="cuda")


def test_device_auto_shards_over_faiss_gpus(tmp_path, corpus, monkeypatch):
    import envs.retrieval.index as index_module

    moved = []
    monkeypatch.setattr(index_module, "_faiss_gpus", lambda: 2)
    monkeypatch.setattr(index_module, "_to_all_gpus", lambda index: moved.append(index) or index)
    loaded = DenseIndex.load(build_index(corpus, HashEncoder(), tmp_path / "idx", show_progress=False))
    assert loaded.backend == "faiss-gpu" and len(moved) == 1


def test_build_script_end_to_end(tmp_path, corpus, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_index.py"
    spec = importlib.util.spec_from_file_location("build_index_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "cli"
    assert module.main(["--corpus", str(corpus.path), "--encoder", "hash:128", "--index-type", "HNSW32",
                        "--out", str(out), "--batch-size", "9", "--quiet"]) == 0
    meta = json.loads((out / META_FILE).read_text())
    assert meta["encoder"] == "hash:128" and meta["factory"] == "HNSW32" and meta["ntotal"] == 60
    assert "ready after" in capsys.readouterr().out


def test_build_script_prints_a_duplicate_id_message_alone(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_index.py"
    spec = importlib.util.spec_from_file_location("build_index_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "title": "t", "text": "x"}) + "\n" for pid in ("a", "b", "a")))
    assert module.main(["--corpus", str(path), "--encoder", "hash:16", "--out", str(tmp_path / "i"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "line 3: duplicate passage id 'a' (first on line 1)" in err and "Traceback" not in err
