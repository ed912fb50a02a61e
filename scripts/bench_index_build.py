"""Index types and how scripts/bench_index.py builds them.

``INDEX_TYPES`` maps each ``--types`` name to its FAISS factory string; ``rerank_depth`` and
``pq_fits`` read names and factory strings. Every IVF type reuses one training sample and one
coarse quantizer with each row's list (``train_shared``, ``train_coarse``); ``build_ivf`` trains
only the codec on top of them and fills the lists directly. ``build_index_type`` builds any type
under ``PeakRss`` and charges IVF types the shared steps, as a stand-alone build would cost.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from scripts.bench_index_data import RowReader
from scripts.bench_index_measure import PeakRss, serialised_bytes

# name -> FAISS factory string ({nlist} filled in). "+rerank<k'>" variants reuse the PQ index.
INDEX_TYPES = {
    "flat": "Flat",
    "hnsw32": "HNSW32",
    "ivf-flat": "IVF{nlist},Flat",
    "ivf-sq16": "IVF{nlist},SQfp16",
    "ivf-pq64": "IVF{nlist},PQ64",
    "ivf-pq48": "IVF{nlist},PQ48",
    "ivf-pq32": "IVF{nlist},PQ32",
    "opq48": "OPQ48,IVF{nlist},PQ48",
    "opq32": "OPQ32,IVF{nlist},PQ32",
}
RERANKABLE = ("ivf-pq64", "ivf-pq48", "ivf-pq32", "opq48", "opq32")
DEFAULT_TYPES = list(INDEX_TYPES) + [f"{name}+rerank" for name in RERANKABLE]


def rerank_depth(name: str) -> int:
    """k' of a ``X+rerank<k'>`` name; 0 for a type searched without re-ranking."""
    _, plus, depth = name.partition("+rerank")
    return int(depth) if plus else 0


def pq_fits(factory: str, dim: int) -> bool:
    """PQm and OPQm need m to divide dim."""
    parts = [p for p in factory.split(",") if p.startswith(("PQ", "OPQ"))]
    return all(dim % int(p.lstrip("OPQ")) == 0 for p in parts)


def default_nlist(n: int) -> int:
    """Power of two nearest 4*sqrt(n), at most n/39 (FAISS wants 39 training points per list)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(n, 1))))
    while nlist > 1 and nlist * 39 > n:
        nlist //= 2
    return nlist


def train_row_numbers(n: int, train_size: int, seed: int) -> np.ndarray:
    """Sorted, seeded choice of the rows that train IVF/PQ/OPQ (all rows when n <= train_size)."""
    if n <= train_size:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 3]).choice(n, size=train_size, replace=False))


@dataclass
class Coarse:
    """One trained IVF coarse quantizer shared by every IVF type, and every row's list."""

    centroids: np.ndarray  # (nlist, dim)
    assign: np.ndarray  # (n,) int64
    train_seconds: float
    assign_seconds: float
    peak_rss_mb: float


def train_coarse(reader: RowReader, sample: np.ndarray, nlist: int) -> Coarse:
    """k-means exactly as ``IVF{nlist},Flat`` trains it, then each row's nearest centroid."""
    with PeakRss() as rss:
        started = time.perf_counter()
        ivf = faiss.index_factory(reader.dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        ivf.train(sample)
        quantizer = ivf.quantizer
        trained = time.perf_counter()
        assign = np.empty(reader.n, dtype=np.int64)
        for start, block in reader.chunks():
            assign[start:start + len(block)] = quantizer.search(block, 1)[1][:, 0]
        done = time.perf_counter()
        centroids = quantizer.reconstruct_n(0, nlist)
    return Coarse(centroids, assign, trained - started, done - trained, rss.mb)


def build_ivf(factory: str, reader: RowReader, sample: np.ndarray, coarse: Coarse,
              scratch: Path, opq_iters: int = 50) -> tuple[faiss.Index, int]:
    """Train and fill an IVF factory index, reusing the shared coarse quantizer and assignment.
    Returns the index and the serialised size of the trained, still empty index."""
    index = faiss.index_factory(reader.dim, factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    transforms = []
    if isinstance(index, faiss.IndexPreTransform):
        transforms = [faiss.downcast_VectorTransform(index.chain.at(i)) for i in range(index.chain.size())]
    centroids = coarse.centroids
    for transform in transforms:  # e.g. OPQ: learn the rotation, then rotate the centroids
        if isinstance(transform, faiss.OPQMatrix):
            transform.niter = opq_iters
        transform.train(np.ascontiguousarray(sample))
        sample = transform.apply(sample)
        centroids = transform.apply(centroids)
    quantizer = faiss.IndexFlatIP(ivf.d)
    quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    ivf.quantizer = quantizer
    ivf.own_fields = True
    quantizer.this.disown()
    if isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ):
        # The factory turns on polysemous training (a codeword permutation for Hamming-distance
        # filtering, ~45 s on 768-d); plain search never uses it.
        faiss.downcast_index(ivf).do_polysemous_training = False
    ivf.train(np.ascontiguousarray(sample))  # the quantizer is trained: only the codec (PQ, SQ) trains
    fixed_bytes = serialised_bytes(index, scratch)
    for start, block in reader.chunks():
        for transform in transforms:
            block = transform.apply(block)
        lists = np.ascontiguousarray(coarse.assign[start:start + len(block)])
        ivf.add_core(len(block), faiss.swig_ptr(np.ascontiguousarray(block)), None, faiss.swig_ptr(lists))
    index.ntotal = ivf.ntotal  # a pre-transform wrapper does not see adds made to its sub-index
    index.is_trained = ivf.is_trained
    return index, fixed_bytes


def fill(index: faiss.Index, reader: RowReader, stop: int) -> faiss.Index:
    """Add rows [0, stop) to an index that needs no training (Flat, HNSW), chunk by chunk."""
    for _, block in reader.chunks(stop):
        index.add(block)
    return index


@dataclass
class SharedTraining:
    """The training sample and coarse quantizer every IVF type reuses, and what they cost."""

    sample: np.ndarray
    sample_seconds: float
    sample_mb: float
    coarse: Coarse


def train_shared(reader: RowReader, n: int, train_size: int, seed: int, nlist: int) -> SharedTraining:
    """Read the training sample, then train the coarse quantizer and assign every row to a list."""
    started = time.perf_counter()
    sample = reader.take(train_row_numbers(n, train_size, seed))
    sample_seconds, sample_mb = time.perf_counter() - started, sample.nbytes / 2**20
    coarse = train_coarse(reader, sample, nlist)
    return SharedTraining(sample, sample_seconds, sample_mb, coarse)


@dataclass
class BuiltIndex:
    """A filled index and its build cost (an IVF type's includes the shared training steps)."""

    index: faiss.Index
    factory: str
    rows_indexed: int
    seconds: float
    peak_rss_mb: float
    fixed_bytes: int  # serialised size of the trained, still empty index


def build_index_type(base: str, nlist: int, reader: RowReader, hnsw_n: int | None,
                     shared: SharedTraining | None, scratch: Path, opq_iters: int) -> BuiltIndex:
    """Build ``base`` (an ``INDEX_TYPES`` name) on the rows of ``reader``, timing it and measuring
    its peak RSS increase. HNSW is built on the first ``hnsw_n`` rows only when that is given."""
    n, dim = reader.n, reader.dim
    factory = INDEX_TYPES[base].format(nlist=nlist)
    rows_indexed = n
    with PeakRss() as rss:
        started = time.perf_counter()
        if base == "flat":
            index = faiss.IndexFlatIP(dim)
            fixed = serialised_bytes(index, scratch)
            fill(index, reader, n)
        elif base == "hnsw32":
            rows_indexed = min(hnsw_n or n, n)
            index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            fixed = serialised_bytes(index, scratch)
            fill(index, reader, rows_indexed)
        else:
            index, fixed = build_ivf(factory, reader, shared.sample, shared.coarse, scratch, opq_iters)
        seconds = time.perf_counter() - started
    peak = rss.mb
    if shared is not None and base not in ("flat", "hnsw32"):  # as a stand-alone build would
        coarse = shared.coarse
        seconds += shared.sample_seconds + coarse.train_seconds + coarse.assign_seconds
        peak = shared.sample_mb + max(peak, coarse.peak_rss_mb)
    return BuiltIndex(index, factory, rows_indexed, seconds, peak, fixed)
