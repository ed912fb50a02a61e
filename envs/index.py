"""Dense FAISS index over a corpus: a resumable streamed build and a device-aware searcher.

An index directory holds:

- ``embeddings.npy``: float32 ``(n, dim)`` passage embeddings, row i = corpus row i, written
  batch by batch through a numpy memmap so memory does not grow with the corpus. It is kept
  after the build on purpose: the CUDA path without faiss-gpu searches it directly, and a new
  index type is built from it without encoding the corpus again. (Cost: for Flat it doubles the
  disk use; delete it by hand if neither matters to you.)
- ``build_state.json``: rows embedded so far, rewritten atomically after every batch, so an
  interrupted build resumes from the last completed batch;
- ``index.faiss``: the FAISS index (inner product on L2-normalised vectors, i.e. cosine);
- ``meta.json``: encoder, dim, corpus path/fingerprint/size, index type, faiss version. It is
  written last, so its presence marks a complete index.

Memory: embedding is streamed, but the FAISS index itself lives in RAM while it is built and
searched; Flat and HNSW keep every vector (n * dim * 4 bytes, 64 GB for 21M x 768), IVF-PQ keeps
m bytes per vector, so large corpora want ``"ivfpq"`` or GPUs.

``index_type`` is any FAISS factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,PQ16"`` ...) or
one of the names ``"flat"``, ``"hnsw"``, ``"ivfpq"``, which :func:`resolve_index_type` turns into a
factory string sized for the corpus.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Iterator

import faiss
import numpy as np

from envs.atomic import write_json_atomic
from envs.encoders import Encoder

EMBEDDINGS_FILE = "embeddings.npy"
STATE_FILE = "build_state.json"
INDEX_FILE = "index.faiss"
META_FILE = "meta.json"
LOCK_FILE = "build.lock"
FORMAT_VERSION = 1


class IndexMismatchError(ValueError):
    """An index was paired with a corpus (or encoder) other than the one it was built from."""


# ----- small file helpers ---------------------------------------------------------------------


def write_index_atomic(index: faiss.Index, path: Path) -> None:
    """``faiss.write_index`` to a temp file, fsync, then rename over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        faiss.write_index(index, str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None if the file is missing."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def build_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out_dir`` so two processes never build into it at once
    (the second waits, then finds the index complete). A no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(out_dir / LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_meta(index_dir: str | os.PathLike) -> dict:
    """``meta.json`` of a complete index directory; FileNotFoundError with advice otherwise."""
    meta = read_json(Path(index_dir) / META_FILE)
    if meta is None:
        raise FileNotFoundError(
            f"no complete index in {index_dir} (missing {META_FILE}); "
            "build one with scripts/build_index.py or envs.index.build_index"
        )
    return meta


# ----- index types ----------------------------------------------------------------------------


def resolve_index_type(index_type: str, n_rows: int, dim: int) -> str:
    """FAISS factory string for ``index_type``.

    ``"flat"`` -> ``"Flat"``; ``"hnsw"`` -> ``"HNSW32"``; ``"ivfpq"`` -> ``"IVF{nlist},PQ{m}"`` with
    nlist about 4*sqrt(n) (at most n/39, so k-means has 39 points per list) and m the largest of
    64, 48, 32, 16, 8, 4, 2, 1 dividing ``dim``; for corpora under 9,984 rows the PQ codes get
    fewer than 8 bits so that 39 points per centroid remain. Any other string is returned
    unchanged as a factory string.
    """
    name = index_type.strip()
    lowered = name.lower()
    if lowered == "flat":
        return "Flat"
    if lowered == "hnsw":
        return "HNSW32"
    if lowered == "ivfpq":
        n_rows = max(int(n_rows), 1)
        nlist = max(1, min(round(4 * math.sqrt(n_rows)), n_rows // 39))
        m = next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if dim % m == 0)
        nbits = max(1, min(8, int(math.log2(max(n_rows // 39, 2)))))
        return f"IVF{nlist},PQ{m}" + ("" if nbits == 8 else f"x{nbits}")
    return name


def _train_rows(n_rows: int, train_size: int, seed: int = 0) -> np.ndarray:
    """Sorted, reproducible sample of at most ``train_size`` row numbers."""
    if n_rows <= train_size:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size=train_size, replace=False))


# ----- build ----------------------------------------------------------------------------------


def _encoder_state(encoder: Encoder, corpus) -> dict:
    """What must match for stored embeddings to be reused."""
    return {
        "encoder": encoder.name,
        "encoder_settings": dict(getattr(encoder, "settings", {}) or {}),
        "dim": int(encoder.dim),
        "corpus_fingerprint": corpus.fingerprint(),
        "corpus_size": len(corpus),
    }


def _open_embeddings(path: Path, shape: tuple[int, int], fresh: bool) -> np.memmap:
    """The embeddings memmap: reopened for writing if it exists with this shape, else created."""
    if not fresh and path.exists():
        memmap = np.lib.format.open_memmap(path, mode="r+")
        if memmap.shape == shape and memmap.dtype == np.float32:
            return memmap
        del memmap
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)


def embed_corpus(corpus, encoder: Encoder, out_dir: Path, batch_size: int = 256, resume: bool = True,
                 on_batch: Callable[[int, int], None] | None = None, show_progress: bool = True) -> np.memmap:
    """Stream passage embeddings into ``out_dir/embeddings.npy``; return the memmap (read-only).

    After each batch the memmap is flushed and ``build_state.json`` records the rows done; with
    ``resume`` a matching state continues from there. ``on_batch(rows_done, total)`` is called
    after each checkpoint (progress reporting; tests raise from it to simulate a crash).
    """
    from tqdm.auto import tqdm

    n, dim = len(corpus), int(encoder.dim)
    state_path, emb_path = out_dir / STATE_FILE, out_dir / EMBEDDINGS_FILE
    wanted = _encoder_state(encoder, corpus)
    state = read_json(state_path) if resume else None
    matches = state is not None and {k: state.get(k) for k in wanted} == wanted and emb_path.exists()
    done = int(state["rows_done"]) if matches else 0
    memmap = _open_embeddings(emb_path, (n, dim), fresh=not matches)
    if not matches:
        write_json_atomic({**wanted, "rows_done": 0}, state_path)

    bar = tqdm(total=n, initial=done, unit="passage", desc="embedding", disable=not show_progress or done >= n)
    try:
        for first, passages in corpus.iter_batches(batch_size, start_row=done):
            vectors = encoder.encode_passages(passages, show_progress=False)
            if vectors.shape != (len(passages), dim):
                raise ValueError(f"encoder returned shape {vectors.shape}, expected {(len(passages), dim)}")
            memmap[first:first + len(passages)] = vectors
            memmap.flush()
            done = first + len(passages)
            write_json_atomic({**wanted, "rows_done": done}, state_path)
            bar.update(len(passages))
            if on_batch is not None:
                on_batch(done, n)
    finally:
        bar.close()
        del memmap
    if done != n:
        raise RuntimeError(f"embedded {done} of {n} rows; the corpus ended early")
    return np.load(emb_path, mmap_mode="r")


def train_and_fill(embeddings: np.ndarray, factory: str, train_size: int = 100_000,
                   add_chunk: int = 65_536) -> tuple[faiss.Index, int]:
    """A new inner-product index from ``factory``, trained (when the type needs it) on a
    reproducible sample of at most ``train_size`` rows, then filled from ``embeddings`` in
    chunks. Returns ``(index, rows used for training)``."""
    n, dim = embeddings.shape
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    trained_on = 0
    if not index.is_trained:
        sample = np.ascontiguousarray(embeddings[_train_rows(n, train_size)], dtype=np.float32)
        index.train(sample)
        trained_on = len(sample)
    for start in range(0, n, add_chunk):
        index.add(np.ascontiguousarray(embeddings[start:start + add_chunk], dtype=np.float32))
    return index, trained_on


def build_index(corpus, encoder: Encoder, out_dir: str | os.PathLike, index_type: str = "Flat",
                batch_size: int = 256, resume: bool = True, train_size: int = 100_000,
                on_batch: Callable[[int, int], None] | None = None, show_progress: bool = True) -> Path:
    """Embed ``corpus`` with ``encoder`` and build a FAISS index in ``out_dir``; return ``out_dir``.

    With ``resume`` (the default) a complete index with the same corpus, encoder and type is
    reused as is, stored embeddings are reused for a new index type, and an interrupted
    embedding pass continues from its last batch. ``resume=False`` starts from scratch.
    """
    if len(corpus) == 0:
        raise ValueError(f"corpus {corpus.path} is empty; nothing to index")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with build_lock(out_dir):
        factory = resolve_index_type(index_type, len(corpus), encoder.dim)
        identity = {**_encoder_state(encoder, corpus), "factory": factory}
        meta = read_json(out_dir / META_FILE)
        if resume and meta and (out_dir / INDEX_FILE).exists() and all(meta.get(k) == v for k, v in identity.items()):
            return out_dir
        with contextlib.suppress(FileNotFoundError):
            (out_dir / META_FILE).unlink()  # the directory is incomplete until meta.json returns

        embeddings = embed_corpus(corpus, encoder, out_dir, batch_size, resume, on_batch, show_progress)
        embedded = time.perf_counter()
        index, trained_on = train_and_fill(embeddings, factory, train_size)
        write_index_atomic(index, out_dir / INDEX_FILE)
        write_json_atomic({
            **identity,
            "format_version": FORMAT_VERSION,
            "index_type": index_type,
            "corpus_path": str(Path(corpus.path).resolve()),
            "ntotal": int(index.ntotal),
            "trained_on_rows": trained_on,
            "faiss_version": faiss.__version__,
            "embeddings_file": EMBEDDINGS_FILE,
            "index_file": INDEX_FILE,
            "index_seconds": round(time.perf_counter() - embedded, 3),
            "build_seconds": round(time.perf_counter() - started, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, out_dir / META_FILE)
    return out_dir


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
    when faiss has no GPU support) or ``"faiss-cpu"``."""

    def __init__(self, index_dir: Path, meta: dict, backend: str, searcher, ef_search: int = 64,
                 nprobe: int | None = None):
        self.index_dir = index_dir
        self.meta = meta
        self.backend = backend
        self._searcher = searcher
        self.dim = int(meta["dim"])
        self.ntotal = int(meta["ntotal"])
        self.ef_search = ef_search  # HNSW only
        self.nprobe = nprobe  # IVF only

    @classmethod
    def load(cls, index_dir: str | os.PathLike, corpus=None, device: str = "auto",
             nprobe: int = 32, ef_search: int = 64) -> "DenseIndex":
        """Open ``index_dir``; with ``corpus``, refuse (IndexMismatchError) unless it is the corpus
        the index was built from.

        ``device``: ``"auto"`` (faiss-gpu if it sees GPUs, else torch on CUDA for Flat, else CPU),
        ``"cuda"`` (the same but an error without a GPU path) or ``"cpu"``. ``nprobe`` (IVF lists
        visited) and ``ef_search`` (HNSW beam, raised to k when smaller) trade speed for recall.
        """
        index_dir = Path(index_dir)
        meta = read_meta(index_dir)
        if corpus is not None:
            check_corpus(meta, corpus, index_dir)
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")

        if device != "cpu" and _faiss_gpus() == 0 and _torch_cuda() and meta["factory"] == "Flat":
            embeddings = np.load(index_dir / meta.get("embeddings_file", EMBEDDINGS_FILE), mmap_mode="r")
            return cls(index_dir, meta, "torch-cuda", _TorchFlatSearcher(embeddings))

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

                warnings.warn(f"faiss could not move {meta['factory']} to GPU ({err}); searching on CPU")
        elif device == "cuda":
            raise RuntimeError(
                f"device='cuda' but faiss sees no GPU and the torch path needs a Flat index "
                f"(this one is {meta['factory']!r})"
            )
        return cls(index_dir, meta, backend, index, ef_search, None if ivf is None else min(nprobe, ivf.nlist))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores (n, k) float32, rows (n, k) int64)``, best first.

        When fewer than ``k`` rows exist, rows are padded with -1 and scores with -inf.
        """
        if k < 1:
            raise ValueError("k must be at least 1")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (n, {self.dim}), got {queries.shape}")
        if len(queries) == 0:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        if self.backend == "torch-cuda":
            scores, rows = self._searcher.search(queries, k)
        else:
            if isinstance(self._searcher, faiss.IndexHNSW):
                self._searcher.hnsw.efSearch = max(self.ef_search, k)
            scores, rows = self._searcher.search(queries, k)
        return _pad(np.asarray(scores, np.float32), np.asarray(rows, np.int64), k)

    def __len__(self) -> int:
        return self.ntotal

    def __repr__(self) -> str:
        return f"DenseIndex({str(self.index_dir)!r}, type={self.meta['factory']!r}, rows={self.ntotal}, backend={self.backend!r})"


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
