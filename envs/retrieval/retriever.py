"""Batched dense retrieval: queries in, ranked :class:`~envs.types.Hit` lists out.

One ``search`` call makes at most one encoder call and one index call, whatever the number of
queries: repeated queries are answered once, and ``(query, k)`` pairs seen recently come from an
LRU cache. The ``stats`` counters let benchmarks split time between encoding and index search.
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import Encoder, load_encoder
from envs.retrieval.index import DenseIndex, IndexMismatchError, read_meta
from envs.types import Hit


@dataclass
class RetrieverStats:
    """Counters since creation or the last ``reset()``.

    ``calls``: search calls; ``queries``: queries received (repeats included);
    ``cache_hits``: distinct queries of a call served from the cache; ``encoded``: queries sent to
    the encoder; ``encode_calls`` / ``index_calls``: model and index invocations;
    ``encode_seconds`` / ``index_seconds``: wall time inside them.
    """

    calls: int = 0
    queries: int = 0
    cache_hits: int = 0
    encoded: int = 0
    encode_calls: int = 0
    index_calls: int = 0
    encode_seconds: float = 0.0
    index_seconds: float = 0.0

    def reset(self) -> None:
        for name, value in asdict(RetrieverStats()).items():
            setattr(self, name, value)

    def as_dict(self) -> dict:
        return asdict(self)


class Retriever:
    """Corpus + encoder + index. ``search(queries, k) -> list[list[Hit]]``, ranks 1-based.

    ``cache_size`` bounds the LRU cache of ``(query, k)`` results (0 turns it off). Calls are
    serialised by a lock, so one retriever may be shared by threads (e.g. an HTTP server).
    """

    def __init__(self, corpus, encoder: Encoder, index: DenseIndex, cache_size: int = 4096):
        if encoder.dim != index.dim:
            raise IndexMismatchError(
                f"encoder {encoder.name!r} makes {encoder.dim}-dim vectors but the index "
                f"{index.index_dir} holds {index.dim}-dim ones (built with {index.meta.get('encoder')!r})"
            )
        if encoder.name != index.meta.get("encoder"):
            warnings.warn(
                f"encoder {encoder.name!r} differs from the one the index was built with "
                f"({index.meta.get('encoder')!r}); scores may be meaningless", stacklevel=2,
            )
        built_dtype = (index.meta.get("encoder_settings") or {}).get("dtype")
        query_dtype = (getattr(encoder, "settings", None) or {}).get("dtype")
        if built_dtype and query_dtype and built_dtype != query_dtype:
            warnings.warn(
                f"queries are encoded in {query_dtype} but the index {index.index_dir} holds passages encoded in "
                f"{built_dtype}; load the encoder with dtype={built_dtype!r} to match", stacklevel=2,
            )
        self.corpus = corpus
        self.encoder = encoder
        self.index = index
        self.cache_size = int(cache_size)
        self.stats = RetrieverStats()
        self._cache: OrderedDict[tuple[str, int], tuple[Hit, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, index_dir: str | os.PathLike, corpus=None, device: str = "auto",
                 cache_size: int = 4096, **encoder_kwargs) -> Retriever:
        """Load an index directory with its corpus and encoder.

        ``corpus``: None (the path recorded in ``meta.json``), a path, or a loaded corpus; it must
        be the corpus the index was built from. ``device`` is the index device (``"auto"``,
        ``"cpu"``, ``"cuda"``); the encoder follows it unless ``encoder_kwargs`` says otherwise, and
        takes the precision (``dtype``) and token limit the passages were embedded with, so that
        queries are encoded the same way.
        """
        meta = read_meta(index_dir)
        if corpus is None:
            corpus = meta["corpus_path"]
        if isinstance(corpus, (str, os.PathLike)):
            corpus = load_corpus(Path(corpus))
        index = DenseIndex.load(index_dir, corpus=corpus, device=device)
        encoder_kwargs.setdefault("device", None if device == "auto" else device)
        for setting in ("max_length", "dtype"):
            value = (meta.get("encoder_settings") or {}).get(setting)
            if value:
                encoder_kwargs.setdefault(setting, value)
        encoder = load_encoder(meta["encoder"], **encoder_kwargs)
        return cls(corpus, encoder, index, cache_size=cache_size)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits for each query, in input order (fewer when the corpus is smaller)."""
        if k < 1:
            raise ValueError("k must be at least 1")
        queries = list(queries)
        with self._lock:
            self.stats.calls += 1
            self.stats.queries += len(queries)
            found: dict[str, tuple[Hit, ...]] = {}
            misses = []
            for query in dict.fromkeys(queries):  # distinct, in first-seen order
                cached = self._cache_get((query, k))
                if cached is None:
                    misses.append(query)
                else:
                    found[query] = cached
                    self.stats.cache_hits += 1
            if misses:
                for query, hits in zip(misses, self._search_uncached(misses, k)):
                    found[query] = hits
                    self._cache_put((query, k), hits)
            return [list(found[query]) for query in queries]

    def _search_uncached(self, queries: list[str], k: int) -> list[tuple[Hit, ...]]:
        """One encode call and one index call for all ``queries``."""
        started = time.perf_counter()
        vectors = self.encoder.encode_queries(queries)
        encoded = time.perf_counter()
        scores, rows = self.index.search(vectors, k)
        searched = time.perf_counter()
        self.stats.encoded += len(queries)
        self.stats.encode_calls += 1
        self.stats.index_calls += 1
        self.stats.encode_seconds += encoded - started
        self.stats.index_seconds += searched - encoded

        wanted = sorted({int(r) for r in rows.ravel() if r >= 0})
        passages = dict(zip(wanted, self.corpus.get_many(wanted)))
        results = []
        for row_scores, row_ids in zip(scores, rows):
            kept = [(float(s), int(r)) for s, r in zip(row_scores, row_ids) if r >= 0]
            results.append(tuple(Hit.from_passage(passages[r], s, rank) for rank, (s, r) in enumerate(kept, 1)))
        return results

    def _cache_get(self, key: tuple[str, int]) -> tuple[Hit, ...] | None:
        hits = self._cache.get(key)
        if hits is not None:
            self._cache.move_to_end(key)
        return hits

    def _cache_put(self, key: tuple[str, int], hits: tuple[Hit, ...]) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = hits
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        """Forget cached results (the counters stay)."""
        with self._lock:
            self._cache.clear()

    def __repr__(self) -> str:
        return f"Retriever(encoder={self.encoder.name!r}, index={self.index!r}, passages={len(self.corpus)})"
