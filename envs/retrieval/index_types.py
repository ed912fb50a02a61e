"""FAISS index types: the names that are sized for a corpus, and the resident size of any type.

``index_type`` is any FAISS factory string or one of :data:`INDEX_NAMES`, which
:func:`resolve_index_type` sizes for the corpus (n rows, d dims): nlist ~ 4*sqrt(n) inverted
lists (at most n/39, so k-means has 39 points per list), m = the largest of 64, 48, 32, 16, 8, 4,
2, 1 dividing d, 8-bit PQ codes (fewer below 9,984 rows so every code keeps 39 points).

Resident bytes per vector (what :func:`estimate_index_size` computes from the FAISS objects):

==============  =====================================  ========================================
name            factory                                bytes per vector (+ once per index)
==============  =====================================  ========================================
flat            ``Flat``                               4d
hnsw            ``HNSW32``                             4d + 4(2M + M/(M-1)) + 12 (links, levels,
                                                       offsets: ~4d + 272 for M = 32)
fp16            ``SQfp16``                             2d
sq8             ``SQ8``                                d (+ 8d trained ranges)
ivfflat         ``IVF{nlist},Flat``                    4d + 8 (+ 4d per list centroid)
ivf-sqfp16      ``IVF{nlist},SQfp16``                  2d + 8 (+ centroids)
ivf-sq8         ``IVF{nlist},SQ8``                     d + 8 (+ centroids, ranges)
ivfpq           ``IVF{nlist},PQ{m}``                   m + 8 (+ centroids, 256 * 4d codebooks)
opq-ivfpq       ``OPQ{m},IVF{nlist},PQ{m}``            m + 8 (+ the above and a 4d^2 rotation)
==============  =====================================  ========================================

(The + 8 is the int64 id every inverted-list entry carries; each list also costs ~160 bytes
of bookkeeping.) For 21,015,324 x 768 E5 vectors: Flat 64.6 GB, HNSW32 70.3 GB, SQfp16 32.3 GB,
SQ8 16.1 GB, IVF-PQ64 1.6 GB (1.5 GB of codes and ids + 60 MB of centroids and codebooks).

The memory budget and build plan that use these sizes are in :mod:`envs.retrieval.index_memory`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import faiss

LIST_OVERHEAD = 160  # bytes of bookkeeping per inverted list

INDEX_NAMES = {
    "flat": "exact search, 4d bytes/vector",
    "hnsw": "HNSW32 graph over exact vectors, ~4d + 272 bytes/vector",
    "fp16": "SQfp16: half-precision vectors, 2d bytes/vector",
    "sq8": "SQ8: 8-bit scalar quantizer, d bytes/vector",
    "ivfflat": "IVF lists of exact vectors, 4d + 8 bytes/vector",
    "ivf-sqfp16": "IVF lists of fp16 vectors, 2d + 8 bytes/vector",
    "ivf-sq8": "IVF lists of 8-bit vectors, d + 8 bytes/vector",
    "ivfpq": "IVF lists of m-byte PQ codes, m + 8 bytes/vector (pair with --rerank)",
    "opq-ivfpq": "OPQ rotation + IVF-PQ, m + 8 bytes/vector (pair with --rerank)",
}
_ALIASES = {
    "flat": "flat", "hnsw": "hnsw", "fp16": "fp16", "sqfp16": "fp16", "sq8": "sq8",
    "ivfflat": "ivfflat", "ivfsqfp16": "ivf-sqfp16", "ivffp16": "ivf-sqfp16", "ivfsq8": "ivf-sq8",
    "ivfpq": "ivfpq", "opqivfpq": "opq-ivfpq",
}


# ----- names sized for a corpus ---------------------------------------------------------------


def _nlist(n_rows: int) -> int:
    return max(1, min(round(4 * math.sqrt(n_rows)), n_rows // 39))


def _pq_m(dim: int) -> int:
    return next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if dim % m == 0)


def _pq_suffix(n_rows: int) -> str:
    nbits = max(1, min(8, int(math.log2(max(n_rows // 39, 2)))))
    return "" if nbits == 8 else f"x{nbits}"


def index_name(index_type: str) -> str | None:
    """The canonical name in :data:`INDEX_NAMES` that ``index_type`` spells, or None."""
    return _ALIASES.get(re.sub(r"[-_\s]", "", index_type.strip().lower()))


def resolve_index_type(index_type: str, n_rows: int, dim: int) -> str:
    """FAISS factory string for ``index_type``: a name of :data:`INDEX_NAMES` (spelled with or
    without ``-``/``_``, any case) sized for ``n_rows`` x ``dim`` as the module docstring says;
    any other string is returned unchanged as a factory string.

    ``"ivfpq"`` for 21M x 768 -> ``"IVF18330,PQ64"``; for 300 x 512 -> ``"IVF7,PQ64x2"``.
    """
    name = index_name(index_type)
    if name is None:
        return index_type.strip()
    n_rows = max(int(n_rows), 1)
    nlist, m, bits = _nlist(n_rows), _pq_m(dim), _pq_suffix(n_rows)
    return {
        "flat": "Flat",
        "hnsw": "HNSW32",
        "fp16": "SQfp16",
        "sq8": "SQ8",
        "ivfflat": f"IVF{nlist},Flat",
        "ivf-sqfp16": f"IVF{nlist},SQfp16",
        "ivf-sq8": f"IVF{nlist},SQ8",
        "ivfpq": f"IVF{nlist},PQ{m}{bits}",
        "opq-ivfpq": f"OPQ{m},IVF{nlist},PQ{m}{bits}",
    }[name]


# ----- resident sizes -------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexSize:
    """Resident size of one index type for ``dim``-dim vectors.

    ``per_vector``: bytes per stored vector once built (or read back); ``fixed``: bytes that do
    not grow with n (centroids, codebooks, rotations, list bookkeeping); ``growth_per_vector``:
    extra bytes per vector that may be held while filling, for parts FAISS cannot reserve up
    front (HNSW links grow by doubling); ``assign_per_vector``: the int32 list number per row
    that an IVF build keeps to reserve its lists exactly; ``min_train_rows``: fewest training
    rows the type accepts (0: needs no training); ``opq``: an OPQ rotation must be trained.
    """

    factory: str
    dim: int
    per_vector: float
    fixed: int
    growth_per_vector: float = 0.0
    assign_per_vector: int = 0
    min_train_rows: int = 0
    opq: bool = False

    def total(self, n_rows: int) -> int:
        """Resident bytes of the finished index holding ``n_rows`` vectors."""
        return int(self.fixed + math.ceil(n_rows * self.per_vector))

    def while_filling(self, n_rows: int) -> int:
        """Bytes the index and its fill bookkeeping hold at the end of the add phase."""
        extra = n_rows * (self.growth_per_vector + self.assign_per_vector)
        return int(self.total(n_rows) + math.ceil(extra))


def _downcast(index):
    return faiss.downcast_index(index)


def pretransform_chain(index: faiss.IndexPreTransform) -> list:
    """The (downcast) vector transforms an IndexPreTransform applies, in order. ``chain`` is a SWIG
    std::vector read by ``at()`` and ``size()``, though faiss's stubs call it a list."""
    chain: Any = index.chain
    return [faiss.downcast_VectorTransform(chain.at(i)) for i in range(chain.size())]


def _size_of(index, dim: int) -> dict:
    """per_vector, fixed, growth, assign, min_train, opq of a (downcast) faiss index object."""
    if isinstance(index, faiss.IndexPreTransform):
        inner = _size_of(_downcast(index.index), index.index.d)
        for transform in pretransform_chain(index):
            inner["fixed"] += 4 * (transform.d_in * transform.d_out + transform.d_out)
            if isinstance(transform, faiss.OPQMatrix):  # trains its own 8-bit PQ unless linked to the index's
                inner["opq"] = True
                linked = isinstance(_downcast(index.index), (faiss.IndexIVFPQ, faiss.IndexPQ))
                inner["min_train"] = max(inner["min_train"], 1 if linked else 256)
        return inner
    if isinstance(index, faiss.IndexIVF):
        quantizer = _size_of(_downcast(index.quantizer), index.d)
        fixed = int(quantizer["fixed"] + index.nlist * (quantizer["per_vector"] + LIST_OVERHEAD))
        min_train = index.nlist
        if isinstance(index, faiss.IndexIVFPQ):
            fixed += 4 * index.pq.M * index.pq.ksub * index.pq.dsub
            min_train = max(min_train, index.pq.ksub)
        elif isinstance(index, faiss.IndexIVFScalarQuantizer):
            fixed += 8 * index.d
        invlists = index.invlists
        reservable = invlists is not None and isinstance(faiss.downcast_InvertedLists(invlists),
                                                          faiss.ArrayInvertedLists)
        per_vector = index.code_size + 8
        return {"per_vector": per_vector, "fixed": fixed, "growth": 0 if reservable else per_vector,
                "assign": 4 if reservable else 0, "min_train": min_train, "opq": False}
    if isinstance(index, faiss.IndexHNSW):
        storage = _size_of(_downcast(index.storage), index.d)
        nb_neighbors = index.hnsw.nb_neighbors  # type: ignore[attr-defined]  # missing from faiss's stubs
        m = nb_neighbors(1)
        links = 4 * (nb_neighbors(0) + m / max(m - 1, 1)) + 12  # neighbours, level, offset
        storage.update(per_vector=storage["per_vector"] + links, growth=storage["growth"] + links)
        return storage
    if isinstance(index, faiss.IndexFlatCodes):
        fixed, min_train = 0, 0
        if isinstance(index, faiss.IndexPQ):
            fixed, min_train = 4 * index.pq.M * index.pq.ksub * index.pq.dsub, index.pq.ksub
        elif isinstance(index, faiss.IndexScalarQuantizer):
            fixed, min_train = 8 * index.d, 0 if index.is_trained else 1
        return {"per_vector": index.code_size, "fixed": fixed, "growth": 0, "assign": 0,
                "min_train": min_train, "opq": False}
    try:  # an exotic type: its standalone code size, and assume it grows by doubling
        per_vector = index.sa_code_size()
    except RuntimeError:
        per_vector = 4 * dim
    return {"per_vector": per_vector, "fixed": 0, "growth": per_vector, "assign": 0,
            "min_train": 0 if index.is_trained else 1, "opq": False}


def estimate_index_size(factory: str, dim: int) -> IndexSize:
    """:class:`IndexSize` of the FAISS factory string ``factory`` (resolve names first with
    :func:`resolve_index_type`). Builds the empty index object to read its code sizes."""
    index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    size = _size_of(index, int(dim))
    return IndexSize(factory=factory, dim=int(dim), per_vector=float(size["per_vector"]), fixed=int(size["fixed"]),
                     growth_per_vector=float(size["growth"]), assign_per_vector=int(size["assign"]),
                     min_train_rows=int(size["min_train"]), opq=bool(size["opq"]))


def estimate_index_bytes(index_type: str, n_rows: int, dim: int) -> int:
    """Resident bytes of the finished index (a name or factory string) over ``n_rows`` vectors."""
    return estimate_index_size(resolve_index_type(index_type, n_rows, dim), dim).total(n_rows)
