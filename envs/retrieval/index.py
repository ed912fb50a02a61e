"""Dense FAISS index over a corpus: a memory-budgeted, resumable streamed build and a
device-aware searcher with optional exact re-ranking.

The searcher (:class:`DenseIndex`) is here; the build (:func:`build_index`) is in
:mod:`envs.retrieval.index_pipeline`, and its names are importable from here as well.

An index directory holds:

- ``embeddings.npy``: float32 ``(n, dim)`` passage embeddings, row i = corpus row i, written
  batch by batch with ``pwrite`` (see :mod:`envs.retrieval.index_embed`), so memory does not grow with
  the corpus. It is kept after the build on purpose: re-ranking (``rerank``) reads candidate
  rows from it, the CUDA path without faiss-gpu searches it directly, and a new index type is
  built from it without encoding the corpus again. (Cost: 4 * n * dim bytes of disk, 64.6 GB
  for 21M x 768; delete it by hand if none of that matters to you.)
- ``build_state.json``: rows embedded so far, rewritten atomically after every batch, so an
  interrupted build resumes from the last completed batch; ``build_state.shard<i>.json``: the
  same for shard i when one process per device embeds the corpus (``devices=[...]``);
- ``index.faiss``: the FAISS index (inner product on L2-normalised vectors, i.e. cosine);
- ``meta.json``: encoder, dim, corpus path/fingerprint/size, index type and factory string,
  faiss version, search settings (``nprobe``, ``rerank``), the memory budget, the build plan
  (training rows, add chunk, encode batch, estimated index bytes), the peak RSS of the building
  process (``VmHWM`` on Linux: its whole life so far) and, for a sharded build, each
  encoder process's peak. It is written last, so its presence marks a complete index.
- ``build.lock``: held while a build runs, so two processes never build into one directory.

Memory model. Embedding is streamed (a batch at a time). The index is trained on a row-sorted
sample read from the file, then filled chunk by chunk into arrays reserved at their final size
(:mod:`envs.retrieval.index_build`), so the build's peak is about ``baseline + max(training sample
copies, finished index + one chunk)``. With ``memory_budget`` those sizes come from the budget
and a type whose index cannot fit is refused before anything is encoded (formulas in
:mod:`envs.retrieval.index_memory`, bytes-per-vector table in :mod:`envs.retrieval.index_types`).
Searching holds the whole index in RAM: Flat/HNSW keep every vector (4 * dim bytes each, 64.6 GB
for 21M x 768); IVF-PQ keeps m + 8 bytes per vector and, with ``rerank=K'``, re-scores K'
candidates exactly from the memory-mapped ``embeddings.npy``
(:func:`envs.retrieval.rerank.rerank_exact`), which brings back most of the exact recall for the
RAM of the compressed codes.

``index_type`` is any FAISS factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,PQ16"`` ...) or
a name (``flat``, ``hnsw``, ``fp16``, ``sq8``, ``ivfflat``, ``ivf-sqfp16``, ``ivf-sq8``,
``ivfpq``, ``opq-ivfpq``), which :func:`resolve_index_type` sizes for the corpus.
"""
from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np

from envs.retrieval.embeddings_file import EmbeddingsFile  # noqa: F401  (re-exported)
from envs.retrieval.index_build import fill_index, train_and_fill, train_rows  # noqa: F401  (re-exported)
from envs.retrieval.index_embed import (  # noqa: F401  (re-exported)
    EMBEDDINGS_FILE,
    STATE_FILE,
    auto_devices,
    encoder_identity,
    read_json,
)
from envs.retrieval.index_memory import (  # noqa: F401  (re-exported)
    MemoryBudgetError,
    current_rss_bytes,
    format_bytes,
    parse_bytes,
    peak_rss_bytes,
    plan_build,
)
from envs.retrieval.index_pipeline import (  # noqa: F401  (re-exported)
    FORMAT_VERSION,
    INDEX_FILE,
    LOCK_FILE,
    META_FILE,
    build_index,
    build_lock,
    embed_corpus,
    write_index_atomic,
)
from envs.retrieval.index_types import (  # noqa: F401  (re-exported)
    INDEX_NAMES,
    estimate_index_bytes,
    estimate_index_size,
    resolve_index_type,
)
from envs.retrieval.rerank import rerank_exact

DEFAULT_NPROBE = 32

_train_rows = train_rows  # the old private name


class IndexMismatchError(ValueError):
    """An index was paired with a corpus (or encoder) other than the one it was built from."""


def read_meta(index_dir: str | os.PathLike) -> dict:
    """``meta.json`` of a complete index directory; FileNotFoundError with advice otherwise."""
    meta = read_json(Path(index_dir) / META_FILE)
    if meta is None:
        raise FileNotFoundError(
            f"no complete index in {index_dir} (missing {META_FILE}); "
            "build one with scripts/build_index.py or envs.retrieval.index.build_index"
        )
    return meta


# ----- search ---------------------------------------------------------------------------------


class _TorchFlatSearcher:
    """Exact inner-product top-k with torch on CUDA over the fp16 embeddings (no faiss-gpu)."""

    def __init__(self, embeddings: np.ndarray, device: str = "cuda", chunk_rows: int = 1 << 18):
        import torch

        self.torch = torch
        self.device = device
        n, dim = embeddings.shape
        self.matrix = torch.empty((n, dim), dtype=torch.float16, device=device)
        for start in range(0, n, chunk_rows):  # copy in chunks: never the whole file in host RAM
            block = np.array(embeddings[start:start + chunk_rows], dtype=np.float32)  # a writable copy
            self.matrix[start:start + len(block)] = torch.from_numpy(block).to(device, torch.float16)
        self.chunk_rows = chunk_rows

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        torch = self.torch
        n = self.matrix.shape[0]
        kk = min(k, n)
        with torch.no_grad():
            q = torch.from_numpy(queries).to(self.device, torch.float16)
            best_scores, best_rows = [], []
            for start in range(0, n, self.chunk_rows):  # top-k per block, then top-k of those
                scores = (q @ self.matrix[start:start + self.chunk_rows].T).float()
                top = torch.topk(scores, min(kk, scores.shape[1]), dim=1)
                best_scores.append(top.values)
                best_rows.append(top.indices + start)
            scores, rows = torch.cat(best_scores, 1), torch.cat(best_rows, 1)
            top = torch.topk(scores, kk, dim=1)
            rows = torch.gather(rows, 1, top.indices)
        return top.values.cpu().numpy(), rows.cpu().numpy().astype(np.int64)


def _to_all_gpus(index: faiss.Index) -> faiss.Index:
    """The index sharded over every GPU faiss sees, stored in fp16."""
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = True
    return faiss.index_cpu_to_all_gpus(index, co=options)


def _faiss_gpus() -> int:
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class DenseIndex:
    """A loaded index directory. ``search(q, k) -> (scores, rows)``; ``backend`` says where it runs:
    ``"faiss-gpu"`` (sharded fp16 on all GPUs), ``"torch-cuda"`` (exact fp16 matmul, Flat only,
    when faiss has no GPU support) or ``"faiss-cpu"``. With ``rerank`` K' > k the index is asked
    for K' candidates, which are re-scored exactly from the memory-mapped ``embeddings.npy``."""

    def __init__(self, index_dir: Path, meta: dict, backend: str, searcher, ef_search: int = 64,
                 nprobe: int | None = None, rerank: int = 0, embeddings: np.ndarray | None = None):
        self.index_dir = index_dir
        self.meta = meta
        self.backend = backend
        self._searcher = searcher
        self.dim = int(meta["dim"])
        self.ntotal = int(meta["ntotal"])
        self.ef_search = ef_search  # HNSW only
        self.nprobe = nprobe  # IVF only
        self.rerank = int(rerank or 0)
        self._embeddings = embeddings
        if self.rerank and embeddings is None:
            raise ValueError("rerank needs the embeddings")

    @classmethod
    def load(cls, index_dir: str | os.PathLike, corpus=None, device: str = "auto",
             nprobe: int | None = None, ef_search: int = 64, rerank: int | None = None) -> DenseIndex:
        """Open ``index_dir``; with ``corpus``, refuse (IndexMismatchError) unless it is the corpus
        the index was built from.

        ``device``: ``"auto"`` (faiss-gpu if it sees GPUs, else torch on CUDA for Flat, else CPU),
        ``"cuda"`` (the same but an error without a GPU path) or ``"cpu"``. ``nprobe`` (IVF lists
        visited; default: meta.json's, else 32) and ``ef_search`` (HNSW beam, raised to the number
        of candidates when smaller) trade speed for recall. ``rerank``: K' candidates to re-rank
        exactly when K' > k (default: meta.json's ``rerank``; 0 turns it off); it memory-maps
        ``embeddings.npy``, so only the touched rows are read.
        """
        index_dir = Path(index_dir)
        meta = read_meta(index_dir)
        if corpus is not None:
            check_corpus(meta, corpus, index_dir)
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
        nprobe = int(nprobe if nprobe is not None else meta.get("nprobe") or DEFAULT_NPROBE)
        rerank = int(rerank if rerank is not None else meta.get("rerank") or 0)
        if rerank < 0:
            raise ValueError(f"rerank must be >= 0 (0: off), not {rerank}")
        embeddings_path = index_dir / meta.get("embeddings_file", EMBEDDINGS_FILE)
        embeddings = None
        if rerank:
            if not embeddings_path.exists():
                raise FileNotFoundError(
                    f"re-ranking (rerank={rerank}) reads {embeddings_path}, which is missing; "
                    "restore it (rebuild the index) or load with rerank=0"
                )
            embeddings = np.load(embeddings_path, mmap_mode="r")

        if device != "cpu" and _faiss_gpus() == 0 and _torch_cuda() and meta["factory"] == "Flat":
            flat = embeddings if embeddings is not None else np.load(embeddings_path, mmap_mode="r")
            return cls(index_dir, meta, "torch-cuda", _TorchFlatSearcher(flat), rerank=rerank, embeddings=embeddings)

        index = faiss.read_index(str(index_dir / meta.get("index_file", INDEX_FILE)))
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = min(nprobe, ivf.nlist)
        backend = "faiss-cpu"
        if device != "cpu" and _faiss_gpus() > 0:
            try:
                index = _to_all_gpus(index)
                backend = "faiss-gpu"
                if ivf is not None:
                    faiss.GpuParameterSpace().set_index_parameter(index, "nprobe", min(nprobe, ivf.nlist))
            except RuntimeError as err:  # e.g. HNSW has no GPU version
                if device == "cuda":
                    raise
                import warnings

                warnings.warn(f"faiss could not move {meta['factory']} to GPU ({err}); searching on CPU", stacklevel=2)
        elif device == "cuda":
            raise RuntimeError(
                f"device='cuda' but faiss sees no GPU and the torch path needs a Flat index "
                f"(this one is {meta['factory']!r})"
            )
        return cls(index_dir, meta, backend, index, ef_search, None if ivf is None else min(nprobe, ivf.nlist),
                   rerank=rerank, embeddings=embeddings)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores (n, k) float32, rows (n, k) int64)``, best first.

        When fewer than ``k`` rows exist, rows are padded with -1 and scores with -inf. With
        ``rerank`` > k, the scores are exact inner products of the re-ranked candidates.
        """
        if k < 1:
            raise ValueError("k must be at least 1")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (n, {self.dim}), got {queries.shape}")
        if len(queries) == 0:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        fetch = max(k, self.rerank)
        if self.backend == "torch-cuda":
            scores, rows = self._searcher.search(queries, fetch)
        else:
            if isinstance(self._searcher, faiss.IndexHNSW):
                self._searcher.hnsw.efSearch = max(self.ef_search, fetch)
            scores, rows = self._searcher.search(queries, fetch)
        if fetch > k:
            assert self._embeddings is not None  # __init__ refuses a rerank without them
            scores, rows = rerank_exact(self._embeddings, queries, np.asarray(rows, np.int64), k)
        return _pad(np.asarray(scores, np.float32), np.asarray(rows, np.int64), k)

    def __len__(self) -> int:
        return self.ntotal

    def __repr__(self) -> str:
        extra = f", rerank={self.rerank}" if self.rerank else ""
        return (f"DenseIndex({str(self.index_dir)!r}, type={self.meta['factory']!r}, rows={self.ntotal}, "
                f"backend={self.backend!r}{extra})")


def _pad(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Widen to ``k`` columns with row -1 / score -inf, and mark faiss's missing rows the same way."""
    if scores.shape[1] < k:
        extra = k - scores.shape[1]
        scores = np.pad(scores, ((0, 0), (0, extra)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, extra)), constant_values=-1)
    scores[rows < 0] = -np.inf
    return scores, rows


def check_corpus(meta: dict, corpus, index_dir: Path | str = "") -> None:
    """Raise IndexMismatchError unless ``corpus`` has the fingerprint and size in ``meta``."""
    fingerprint, size = corpus.fingerprint(), len(corpus)
    if fingerprint != meta["corpus_fingerprint"] or size != meta["corpus_size"]:
        raise IndexMismatchError(
            f"index {index_dir} was built from corpus {meta.get('corpus_path')} "
            f"(fingerprint {meta['corpus_fingerprint'][:16]}, {meta['corpus_size']} passages), "
            f"but the corpus given is {getattr(corpus, 'path', '?')} "
            f"(fingerprint {fingerprint[:16]}, {size} passages); "
            "use the corpus the index was built from, or rebuild the index for this corpus"
        )
