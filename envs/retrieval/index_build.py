"""Train a FAISS index on a sample of the stored embeddings and fill it in chunks, without
letting it grow by doubling.

FAISS appends vectors to ``std::vector``-backed arrays. Filled chunk by chunk, such an array is
reallocated at twice its size and copied, so a Flat index of S bytes briefly needs up to ~3S
(the Wikipedia-scale builds that were killed at 126 GB held a 64 GB index). Here the arrays are
reserved at their final size before the first add:

- flat code arrays (``Flat``, ``SQ*``, ``PQ*`` and the storage of ``HNSW*``): resized to n
  codes and back to zero, which keeps the capacity;
- IVF inverted lists (``ArrayInvertedLists``): a first pass assigns every row to its list
  (kept as int32), each list is reserved at its exact size, and a second pass adds the rows
  with their precomputed lists (``add_core``), so the coarse quantizer runs once per row. The
  result is byte-identical to plain ``index.add`` calls.

Other structures (HNSW links, fast-scan blocks) are filled with plain adds; the memory plan
counts their growth. Rows are read through :func:`envs.retrieval.embeddings_file.as_row_source`: chunks and
the row-sorted training sample come from the file with ``pread``, never the whole matrix.
"""
from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np

from envs.retrieval.embeddings_file import as_row_source
from envs.retrieval.index_types import pretransform_chain


def train_rows(n_rows: int, train_size: int, seed: int = 0) -> np.ndarray:
    """Sorted, reproducible sample of at most ``train_size`` row numbers."""
    if n_rows <= train_size:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size=train_size, replace=False))


def _pretransforms(index) -> tuple[list, faiss.Index]:
    """(vector transforms applied before the inner index, the inner index)."""
    chain = []
    while isinstance(index, faiss.IndexPreTransform):
        chain += pretransform_chain(index)
        index = faiss.downcast_index(index.index)
    return chain, index


def _link_opq_to_pq(index) -> Callable[[], None]:
    """Let an OPQ rotation train with the index's own PQ (same m and bits) instead of a fresh
    8-bit one, so small corpora with fewer PQ bits can train it. Returns the undo."""
    chain, inner = _pretransforms(index)
    pq = inner.pq if isinstance(inner, (faiss.IndexIVFPQ, faiss.IndexPQ)) else None
    linked = [t for t in chain if isinstance(t, faiss.OPQMatrix) and pq is not None
              and t.M == pq.M and t.d_out == pq.d and pq.nbits != 8]
    for transform in linked:
        transform.pq = pq

    def undo() -> None:
        for transform in linked:
            transform.pq = None

    return undo


def _skip_polysemous_training(index) -> None:
    """PQ codebooks are permuted for polysemous (Hamming-filtered) search by default, which
    takes longer than the rest of the training on small sets and is never used here: search
    runs with ``polysemous_ht = 0``. Results of a plain search do not change."""
    _, inner = _pretransforms(index)
    if isinstance(inner, (faiss.IndexIVFPQ, faiss.IndexPQ)):
        inner.do_polysemous_training = False  # type: ignore[union-attr]  # missing from faiss's stubs


def _reserve_flat_codes(index, n_rows: int) -> None:
    """Reserve the code array of a flat-codes index (or an HNSW's storage) for ``n_rows`` more."""
    _, inner = _pretransforms(index)
    if isinstance(inner, faiss.IndexHNSW):
        inner = faiss.downcast_index(inner.storage)
    if isinstance(inner, faiss.IndexFlatCodes) and inner.codes.is_owned:
        size = inner.codes.size()
        inner.codes.resize(size + n_rows * inner.code_size)  # zero-filled: touched once, here
        inner.codes.resize(size)  # std::vector keeps the capacity


def _reservable_ivf(index):
    """The IVF inside ``index`` when its lists can be reserved and filled with ``add_core``."""
    chain, inner = _pretransforms(index)
    if not isinstance(inner, faiss.IndexIVF):
        return None
    if inner.invlists is None or not isinstance(faiss.downcast_InvertedLists(inner.invlists),
                                                    faiss.ArrayInvertedLists):
        return None
    return chain, inner


def _apply(chain: list, vectors: np.ndarray) -> np.ndarray:
    for transform in chain:
        vectors = transform.apply(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32)


def fill_index(index: faiss.Index, embeddings, add_chunk: int = 65_536, show_progress: bool = False) -> None:
    """Add every row of ``embeddings`` (array, path or :class:`~envs.retrieval.embeddings_file.EmbeddingsFile`)
    to the trained ``index`` in chunks of ``add_chunk`` rows, with the reservations above."""
    from tqdm.auto import tqdm

    source = as_row_source(embeddings)
    n = source.shape[0]
    add_chunk = max(1, int(add_chunk))
    ivf = _reservable_ivf(index)
    if ivf is None:
        _reserve_flat_codes(index, n)
        with tqdm(total=n, unit="vector", desc="adding", disable=not show_progress) as bar:
            for start in range(0, n, add_chunk):
                block = source.read(start, start + add_chunk)
                index.add(block)
                bar.update(len(block))
        return

    chain, inner = ivf
    lists = np.empty(n, dtype=np.int32)
    with tqdm(total=2 * n, unit="vector", desc="assigning+adding", disable=not show_progress) as bar:
        for start in range(0, n, add_chunk):  # pass 1: the list of every row
            block = _apply(chain, source.read(start, start + add_chunk))
            _, nearest = inner.quantizer.search(block, 1)
            lists[start:start + len(block)] = nearest[:, 0]
            bar.update(len(block))
        invlists = faiss.downcast_InvertedLists(inner.invlists)
        counts = np.bincount(lists, minlength=inner.nlist)
        for list_no in np.flatnonzero(counts):
            size = invlists.list_size(int(list_no))
            invlists.resize(int(list_no), size + int(counts[list_no]))
            invlists.resize(int(list_no), size)
        for start in range(0, n, add_chunk):  # pass 2: encode into the reserved lists
            block = _apply(chain, source.read(start, start + add_chunk))
            assigned = np.ascontiguousarray(lists[start:start + len(block)], dtype=np.int64)
            inner.add_core(len(block), faiss.swig_ptr(block), None, faiss.swig_ptr(assigned))
            bar.update(len(block))
    wrapper = index
    while isinstance(wrapper, faiss.IndexPreTransform):  # add_core bypassed the wrappers' counts
        wrapper.ntotal = inner.ntotal
        wrapper = faiss.downcast_index(wrapper.index)


def train_and_fill(embeddings, factory: str, train_size: int = 100_000, add_chunk: int = 65_536,
                   show_progress: bool = False) -> tuple[faiss.Index, int]:
    """A new inner-product index from ``factory``, trained (when the type needs it) on a
    reproducible, row-sorted sample of at most ``train_size`` rows, then filled from
    ``embeddings`` (array, ``.npy`` path or EmbeddingsFile) in chunks of ``add_chunk`` rows.
    Returns ``(index, rows used for training)``."""
    source = as_row_source(embeddings)
    n, dim = source.shape
    index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    trained_on = 0
    if not index.is_trained:
        _skip_polysemous_training(index)
        sample = source.take(train_rows(n, train_size))
        undo = _link_opq_to_pq(index)
        try:
            index.train(sample)
        finally:
            undo()
        trained_on = len(sample)
        del sample  # the sample never coexists with the filled index
    fill_index(index, source, add_chunk, show_progress)
    return index, trained_on
