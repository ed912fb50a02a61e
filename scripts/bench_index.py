"""Benchmark: FAISS index types on synthetic text-embedding-like vectors (RAM, speed, recall).

Stands in for a Wikipedia-scale E5 index (21,015,324 passages x 768) on a CPU. For each index
type it reports build time (train + add), peak RSS increase during the build, bytes per vector
held in RAM (serialised index size / n), the RAM a 21,015,324-passage index would need, search
QPS at batch 1, 64 and 256, and recall@10 against the exact top-10. The last line is
``best_recall10_at_64B=<x>``: the best recall@10 among the types holding <= 64 bytes per vector
in RAM (target >= 0.90).

    python scripts/bench_index.py --n 1000000 --dim 768 [--types opq32+rerank,ivf-flat] [--out results.json]

Data (``generate``): a seeded mixture of Gaussian clusters in a low-rank latent space, mapped
to ``dim`` by a random orthonormal basis, plus isotropic noise and a shared mean direction (so
random pairs have cosine ~0.7, like E5), then L2-normalised. Cluster sizes vary, and each
cluster is stretched differently along the latent axes. Rows are written chunk by chunk to
``<workdir>/vectors.npy`` (float32, reused when the same data is asked for again); queries are
fresh draws from the same mixture. Ground truth: exact top-10 by inner product (chunked matmul).

Index types (``--types``, comma-separated; default all): flat, hnsw32, ivf-flat, ivf-sq16,
ivf-pq64, ivf-pq48, ivf-pq32, opq48, opq32, and ``<pq type>+rerank<k'>`` (the same index asked
for k' candidates, re-scored exactly by envs.rerank.rerank_exact from the float32 file,
memory-mapped; its RAM figure is the compressed index only; ``<pq type>+rerank`` means one row per
depth in ``--rerank``, 200 and 500 by default). Inner product on L2-normalised vectors, as
envs/index.py builds them; nlist defaults to the power of two nearest 4*sqrt(n). IVF-PQ indexes
are trained without FAISS's polysemous training (the factory's default; ~45 s on 768-d, used only
by polysemous search).

Shortcuts, printed with the results:
- every IVF type uses the same coarse quantizer (one k-means, FAISS's default 10 iterations on
  the training sample) and the same assignment of the n rows to lists, computed once; for OPQ
  the centroids are rotated by the learnt orthogonal matrix, which leaves inner products and
  hence assignments unchanged. Each IVF row's build time includes both shared steps, i.e. what a
  stand-alone build would take;
- ``--hnsw-n`` builds HNSW32 on the first rows only (default: all; 1M x 768 takes about 4 minutes
  on two cores); its QPS and recall are then over that subset, against the subset's own top-10;
- Flat's QPS@1 is timed on ``--flat-batch1-queries`` queries (one 3 GB scan each at 1M x 768).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.atomic import write_json_atomic  # noqa: E402
from envs.rerank import rerank_exact  # noqa: E402

WIKIPEDIA_PASSAGES = 21_015_324
RAM_BUDGET_BYTES = 64  # per vector, for the key figure
TARGET_RECALL = 0.90
K = 10
CHUNK_ROWS = 65_536
BATCH_SIZES = (1, 64, 256)

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


# ----- synthetic data ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratorConfig:
    """A fixed mixture distribution; ``n`` rows or queries are i.i.d. draws from it.

    Variances (before L2 normalisation): cluster centres 1.0 in total over the latent axes
    (power-law spectrum), spread inside a cluster ``within``, isotropic noise over all ``dim``
    axes ``noise``, and a shared mean of squared norm ``mean_sq`` (4.67 gives random pairs a
    cosine near 0.7).
    """

    dim: int = 768
    seed: int = 0
    clusters: int = 4000
    latent_dim: int = 64
    spectrum_decay: float = 0.5  # latent axis j has std (j+1)**-decay before scaling
    within: float = 0.6
    noise: float = 0.4
    mean_sq: float = 4.67


class Mixture:
    """Parameters drawn once from ``config.seed``; ``sample(n, rng)`` draws rows."""

    def __init__(self, config: GeneratorConfig):
        self.config = c = config
        rng = np.random.default_rng([c.seed, 0])
        r = min(c.latent_dim, c.dim)
        basis, _ = np.linalg.qr(rng.standard_normal((c.dim, r)))
        self.basis = basis.T.astype(np.float32)  # (r, dim), orthonormal rows
        spectrum = (1.0 + np.arange(r)) ** -c.spectrum_decay
        spectrum /= np.sqrt((spectrum**2).sum())  # total centre variance 1
        self.centres = (rng.standard_normal((c.clusters, r)) * spectrum).astype(np.float32)
        stretch = np.exp(0.5 * rng.standard_normal((c.clusters, r)))  # per-cluster anisotropy
        stretch /= np.sqrt(((stretch * spectrum) ** 2).sum(axis=1, keepdims=True))
        self.spreads = (np.sqrt(c.within) * stretch * spectrum).astype(np.float32)  # (clusters, r)
        sizes = np.exp(rng.standard_normal(c.clusters))  # log-normal cluster sizes
        self.weights = sizes / sizes.sum()
        mean = rng.standard_normal(c.dim)
        self.mean = (np.sqrt(c.mean_sq) * mean / np.linalg.norm(mean)).astype(np.float32)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, dim) float32, L2-normalised rows."""
        c = self.config
        cluster = rng.choice(c.clusters, size=n, p=self.weights)
        latent = self.centres[cluster] + self.spreads[cluster] * rng.standard_normal(
            (n, self.basis.shape[0]), dtype=np.float32)
        x = latent @ self.basis
        x += rng.standard_normal((n, c.dim), dtype=np.float32) * np.float32(math.sqrt(c.noise / c.dim))
        x += self.mean
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def generate(path: Path, n: int, config: GeneratorConfig) -> bool:
    """Write ``n`` rows to ``path`` (.npy, float32) chunk by chunk; chunk i is drawn from its own
    seeded stream, so the file depends only on (config, n). Returns False when a file made from
    the same (config, n) is already there and was reused."""
    stamp = path.with_suffix(".json")
    wanted = {**asdict(config), "n": n, "chunk_rows": CHUNK_ROWS}
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return False
    stamp.unlink(missing_ok=True)
    mixture = Mixture(config)
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (n, config.dim)})
        for chunk, start in enumerate(range(0, n, CHUNK_ROWS)):
            rng = np.random.default_rng([config.seed, 1, chunk])
            mixture.sample(min(CHUNK_ROWS, n - start), rng).tofile(handle)
    write_json_atomic(wanted, stamp)
    return True


def make_queries(n_queries: int, config: GeneratorConfig) -> np.ndarray:
    """Fresh draws from the mixture (a stream the base rows never use)."""
    return Mixture(config).sample(n_queries, np.random.default_rng([config.seed, 2]))


class RowReader:
    """Rows of a float32 .npy file read with plain file reads (not mmap), so reading the file
    during a build adds nothing to the process's RSS beyond the arrays it returns."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
            self.offset = handle.tell()
        if dtype != np.float32 or len(shape) != 2:
            raise ValueError(f"{path}: expected a 2-d float32 array, got {dtype} {shape}")
        self.n, self.dim = shape

    def rows(self, start: int, stop: int) -> np.ndarray:
        count = (stop - start) * self.dim
        block = np.fromfile(self.path, dtype=np.float32, count=count, offset=self.offset + start * self.dim * 4)
        return block.reshape(stop - start, self.dim)

    def chunks(self, stop: int | None = None, size: int = CHUNK_ROWS):
        stop = self.n if stop is None else stop
        for start in range(0, stop, size):
            yield start, self.rows(start, min(start + size, stop))

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given sorted rows, gathered in one pass over the file."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        done = 0
        for start, block in self.chunks():
            picked = rows[(rows >= start) & (rows < start + len(block))]
            out[done:done + len(picked)] = block[picked - start]
            done += len(picked)
        return out


def exact_top_k(reader: RowReader, queries: np.ndarray, k: int, stop: int | None = None) -> np.ndarray:
    """(q, k) int64 rows with the highest inner product among rows [0, stop), best first."""
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_rows = np.zeros((len(queries), 0), dtype=np.int64)
    for start, block in reader.chunks(stop):
        scores = queries @ block.T  # (q, chunk)
        kk = min(k, scores.shape[1])
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], axis=1)
        best_rows = np.concatenate([best_rows, top + start], axis=1)
        keep = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(best_scores, keep, 1)
        best_rows = np.take_along_axis(best_rows, keep, 1)
    return best_rows


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = K) -> float:
    """Mean fraction of each query's true top-k found in its returned top-k."""
    hits = [len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth)]
    return float(np.mean(hits)) / k


# ----- memory ------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _release_free_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRss:
    """Peak RSS increase (MB) inside a ``with`` block. Resets the kernel's high-water mark
    (``/proc/self/clear_refs``) and reads ``VmHWM`` at the end; where that is not allowed, a
    thread samples ``VmRSS`` every 5 ms instead."""

    def __enter__(self) -> "PeakRss":
        _release_free_memory()
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.exact = True
        except OSError:
            self.exact = False
        self.start_kb = _status_kb("VmRSS")
        self.sampled_kb = self.start_kb
        self._stop = threading.Event()
        if not self.exact:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.sampled_kb = max(self.sampled_kb, _status_kb("VmRSS"))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.exact:
            peak_kb = _status_kb("VmHWM")
        else:
            self._thread.join()
            peak_kb = max(self.sampled_kb, _status_kb("VmRSS"))
        self.mb = max(peak_kb - self.start_kb, 0) / 1024


def serialised_bytes(index: faiss.Index, scratch: Path) -> int:
    """Size of ``faiss.write_index(index)``, written to a scratch file (no second copy in RAM)."""
    faiss.write_index(index, str(scratch))
    size = scratch.stat().st_size
    scratch.unlink()
    return size


# ----- building ---------------------------------------------------------------------------------


def default_nlist(n: int) -> int:
    """Power of two nearest 4*sqrt(n), at most n/39 (FAISS wants 39 training points per list)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(n, 1))))
    while nlist > 1 and nlist * 39 > n:
        nlist //= 2
    return nlist


def train_row_numbers(n: int, train_size: int, seed: int) -> np.ndarray:
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
    for _, block in reader.chunks(stop):
        index.add(block)
    return index


# ----- measuring ---------------------------------------------------------------------------------


def time_search(search: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, batch: int,
                count: int) -> tuple[float, np.ndarray]:
    """QPS over the first ``count`` queries sent ``batch`` at a time, and the rows found."""
    found = []
    started = time.perf_counter()
    for start in range(0, count, batch):
        found.append(search(queries[start:min(start + batch, count)]))
    seconds = time.perf_counter() - started
    return count / seconds, np.concatenate(found)


@dataclass
class Row:
    name: str
    factory: str
    rows_indexed: int
    build_seconds: float
    peak_rss_mb: float
    bytes_per_vector: float  # serialised size / rows indexed
    fixed_bytes: int  # serialised size of the trained, empty index (centroids, codebooks, ...)
    wiki_gb: float  # fixed + per-vector part x 21,015,324
    qps: dict
    recall10: float
    search_params: str
    note: str = ""


def measure_rows(names: list[str], index: faiss.Index, reader: RowReader, queries: np.ndarray,
                 truth: np.ndarray, args, build: dict, embeddings_path: Path) -> list[Row]:
    """Search QPS and recall for ``names`` (a type and its +rerank variants) on one built index."""
    rows = []
    ivf = faiss.try_extract_index_ivf(index)
    params = ""
    if ivf is not None:
        ivf.nprobe = min(args.nprobe, ivf.nlist)
        params = f"nprobe={ivf.nprobe}"
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = max(args.ef_search, K)
        params = f"efSearch={index.hnsw.efSearch}"
    for name in names:
        rerank = rerank_depth(name)
        embeddings = np.load(embeddings_path, mmap_mode="r") if rerank else None

        def search(q, rerank=rerank, embeddings=embeddings):
            if not rerank:
                return index.search(q, K)[1]
            candidates = index.search(q, rerank)[1]
            return rerank_exact(embeddings, q, candidates, K)[1]

        search(queries[:4])  # warm-up
        batch1 = args.flat_batch1_queries if name == "flat" else args.batch1_queries
        qps = {}
        for batch in BATCH_SIZES:
            count = min(batch1, len(queries)) if batch == 1 else len(queries)
            qps[batch], found = time_search(search, queries, batch, count)
        note = build.get("note", "")
        if name == "flat" and batch1 < len(queries):
            note = f"QPS@1 on {batch1} queries"
        if rerank:
            note = (f"top-{rerank} re-ranked exactly from the float32 file (memmap, not in the RAM figure; "
                    f"page-cached here; on a large corpus {rerank} random {4 * reader.dim}-byte reads per query)")
        rows.append(Row(
            name=name,
            factory=build["factory"],
            rows_indexed=build["rows"],
            build_seconds=build["seconds"],
            peak_rss_mb=build["peak_rss_mb"],
            bytes_per_vector=build["bytes"] / build["rows"],
            fixed_bytes=build["fixed_bytes"],
            wiki_gb=(build["fixed_bytes"] + (build["bytes"] - build["fixed_bytes"]) / build["rows"] * WIKIPEDIA_PASSAGES) / 1e9,
            qps={str(b): q for b, q in qps.items()},
            recall10=recall_at_k(found, truth),
            search_params=params + (f", k'={rerank}" if rerank else ""),
            note=note,
        ))
        print(format_row(rows[-1]), flush=True)
    return rows


# ----- report ------------------------------------------------------------------------------------

HEADER = (f"{'type':<19} {'factory':<22} {'build s':>8} {'peak RSS MB':>11} {'B/vec':>8} {'21M GB':>7} "
          f"{'QPS@1':>8} {'QPS@64':>8} {'QPS@256':>8} {'R@10':>6}  notes")


def format_row(row: Row) -> str:
    qps = [row.qps[str(b)] for b in BATCH_SIZES]
    notes = "; ".join(s for s in (row.search_params, row.note) if s)
    return (f"{row.name:<19} {row.factory:<22} {row.build_seconds:>8.1f} {row.peak_rss_mb:>11.0f} "
            f"{row.bytes_per_vector:>8.1f} {row.wiki_gb:>7.2f} {qps[0]:>8.1f} {qps[1]:>8.1f} {qps[2]:>8.1f} "
            f"{row.recall10:>6.3f}  {notes}")


def pick_winner(rows: list[Row]) -> tuple[Row | None, Row | None, Row | None]:
    """(best recall@10 within the RAM budget, ties to QPS@64; the fastest at QPS@64 within the
    budget reaching recall@10 >= TARGET_RECALL; best recall@10 overall)."""
    def key(row: Row) -> tuple[float, float]:
        return row.recall10, row.qps["64"]

    within = [r for r in rows if r.bytes_per_vector <= RAM_BUDGET_BYTES]
    on_target = [r for r in within if r.recall10 >= TARGET_RECALL]
    return (max(within, key=key) if within else None,
            max(on_target, key=lambda r: r.qps["64"]) if on_target else None,
            max(rows, key=key) if rows else None)


# ----- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="base vectors")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queries", type=int, default=1000, help="queries (fresh draws, not base rows)")
    parser.add_argument("--types", default=",".join(DEFAULT_TYPES),
                        help=f"comma-separated subset of: {', '.join(DEFAULT_TYPES)}")
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists (default: power of two nearest 4*sqrt(n))")
    parser.add_argument("--nprobe", type=int, default=64, help="IVF lists visited per query")
    parser.add_argument("--ef-search", type=int, default=128, help="HNSW search beam")
    parser.add_argument("--rerank", default="200,500",
                        help="comma-separated candidate depths k' for the +rerank types (0: no re-ranking rows)")
    parser.add_argument("--opq-iters", type=int, default=50, help="OPQ training iterations (FAISS's default: 50)")
    parser.add_argument("--train-size", type=int, default=None,
                        help="rows sampled to train IVF/PQ/OPQ (default: max(100k, 39*nlist), at most n)")
    parser.add_argument("--hnsw-n", type=int, default=None, help="build HNSW on the first this many rows (default: all)")
    parser.add_argument("--batch1-queries", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--flat-batch1-queries", type=int, default=20, help="the same for Flat (a full scan each)")
    parser.add_argument("--clusters", type=int, default=GeneratorConfig.clusters, help="mixture components")
    parser.add_argument("--latent-dim", type=int, default=GeneratorConfig.latent_dim, help="rank of the structured part")
    parser.add_argument("--workdir", default=None, help="where vectors.npy goes (default: a temp dir, removed at the end)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--threads", type=int, default=None, help="FAISS OpenMP threads (default: all cores)")
    args = parser.parse_args(argv)
    try:
        args.rerank = [int(k) for k in args.rerank.split(",") if k.strip() and int(k) > 0]
        args.types = expand_types([t.strip() for t in args.types.split(",") if t.strip()], args.rerank)
    except ValueError as err:
        parser.error(str(err))
    return args


def expand_types(names: list[str], depths: list[int]) -> list[str]:
    """Check ``--types`` names and turn each ``X+rerank`` into ``X+rerank<k'>`` for every depth."""
    out = []
    for name in names:
        base, plus, depth = name.partition("+rerank")
        if base not in INDEX_TYPES or (plus and (base not in RERANKABLE or not (depth == "" or depth.isdigit()))):
            raise ValueError(f"unknown --types entry {name!r}; choose from {', '.join(DEFAULT_TYPES)} "
                             "(+rerank<k'> for a single depth)")
        expanded = [f"{base}+rerank{k}" for k in depths] if plus and not depth else [name]
        out += [e for e in expanded if e not in out]
    return out


def rerank_depth(name: str) -> int:
    """k' of a ``X+rerank<k'>`` name; 0 for a type searched without re-ranking."""
    _, plus, depth = name.partition("+rerank")
    return int(depth) if plus else 0


def pq_fits(factory: str, dim: int) -> bool:
    """PQm and OPQm need m to divide dim."""
    parts = [p for p in factory.split(",") if p.startswith(("PQ", "OPQ"))]
    return all(dim % int(p.lstrip("OPQ")) == 0 for p in parts)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_index_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, workdir: Path) -> dict:
    n, dim = args.n, args.dim
    nlist = args.nlist or default_nlist(n)
    train_size = min(n, args.train_size or max(100_000, 39 * nlist))
    config = GeneratorConfig(dim=dim, seed=args.seed, clusters=args.clusters, latent_dim=args.latent_dim)
    path = workdir / "vectors.npy"
    depths = ",".join(map(str, args.rerank)) or "none"
    print(f"n={n} dim={dim} queries={args.queries} seed={args.seed} nlist={nlist} nprobe={min(args.nprobe, nlist)} "
          f"train_size={train_size} opq_iters={args.opq_iters} rerank_k'={depths} hnsw_n={min(args.hnsw_n or n, n)} "
          f"faiss={faiss.__version__} threads={faiss.omp_get_max_threads()}", flush=True)

    started = time.perf_counter()
    made = generate(path, n, config)
    print(f"data: {path} ({'generated' if made else 'reused'}, {time.perf_counter() - started:.1f} s); {config}", flush=True)
    reader = RowReader(path)
    queries = make_queries(args.queries, config)
    started = time.perf_counter()
    truth = exact_top_k(reader, queries, K)
    print(f"ground truth: exact top-{K} of {args.queries} queries in {time.perf_counter() - started:.1f} s", flush=True)

    # Group the requested names by the index they need, in registry order.
    wanted = {}
    for name in args.types:
        wanted.setdefault(name.partition("+rerank")[0], []).append(name)
    skipped = [b for b in wanted if not pq_fits(INDEX_TYPES[b], dim)]
    for base in skipped:
        print(f"skipping {wanted.pop(base)}: {INDEX_TYPES[base]} needs m to divide dim={dim}")

    coarse, sample, sample_seconds, sample_mb = None, None, 0.0, 0.0
    if any(INDEX_TYPES[b].startswith(("IVF", "OPQ")) for b in wanted):
        started = time.perf_counter()
        sample = reader.take(train_row_numbers(n, train_size, args.seed))
        sample_seconds, sample_mb = time.perf_counter() - started, sample.nbytes / 2**20
        coarse = train_coarse(reader, sample, nlist)
        print(f"shared by the IVF rows: training sample of {len(sample)} rows ({sample_mb:.0f} MB, read in "
              f"{sample_seconds:.1f} s), coarse quantizer IVF{nlist} (k-means {coarse.train_seconds:.1f} s, "
              f"peak RSS +{coarse.peak_rss_mb:.0f} MB), list of each of the {n} rows ({coarse.assign_seconds:.1f} s); "
              "every IVF row's build s and peak RSS include them", flush=True)

    print(HEADER, flush=True)
    rows: list[Row] = []
    scratch = workdir / "index.scratch"
    for base, names in ((b, wanted[b]) for b in INDEX_TYPES if b in wanted):
        factory = INDEX_TYPES[base].format(nlist=nlist)
        rows_indexed, base_truth, note = n, truth, ""
        with PeakRss() as rss:
            started = time.perf_counter()
            if base == "flat":
                index = faiss.IndexFlatIP(dim)
                fixed = serialised_bytes(index, scratch)
                fill(index, reader, n)
            elif base == "hnsw32":
                rows_indexed = min(args.hnsw_n or n, n)
                index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
                fixed = serialised_bytes(index, scratch)
                fill(index, reader, rows_indexed)
            else:
                index, fixed = build_ivf(factory, reader, sample, coarse, scratch, args.opq_iters)
            seconds = time.perf_counter() - started
        peak = rss.mb
        if coarse is not None and base not in ("flat", "hnsw32"):  # as a stand-alone build would
            seconds += sample_seconds + coarse.train_seconds + coarse.assign_seconds
            peak = sample_mb + max(peak, coarse.peak_rss_mb)
        if rows_indexed < n:
            base_truth = exact_top_k(reader, queries, K, stop=rows_indexed)
            note = f"built on the first {rows_indexed} of {n} rows; QPS and recall on that subset"
        build = {"factory": factory, "rows": rows_indexed, "seconds": seconds, "peak_rss_mb": peak,
                 "bytes": serialised_bytes(index, scratch), "fixed_bytes": fixed, "note": note}
        rows += measure_rows(names, index, reader, queries, base_truth, args, build, path)
        del index
        _release_free_memory()

    best, fastest, overall = pick_winner(rows)
    print()
    print(HEADER)
    for row in rows:
        print(format_row(row))
    print(f"B/vec = serialised index size / rows indexed (what the index holds in RAM; the key figure counts "
          f"types with B/vec <= {RAM_BUDGET_BYTES}); 21M GB = fixed part (centroids, codebooks, rotation) + "
          f"per-vector part x {WIKIPEDIA_PASSAGES:,} ({RAM_BUDGET_BYTES} B/vector there = "
          f"{RAM_BUDGET_BYTES * WIKIPEDIA_PASSAGES / 1e9:.2f} GB); QPS@1 on {min(args.batch1_queries, args.queries)} queries, "
          f"QPS@64/@256 on all {args.queries}; {faiss.omp_get_max_threads()} threads; peak RSS MB = increase "
          "during the build.")
    if coarse is not None:
        print(f"IVF rows share one training sample, coarse quantizer and list assignment ({sample_seconds:.1f} s + "
              f"{coarse.train_seconds:.1f} s + {coarse.assign_seconds:.1f} s, {sample_mb:.0f} MB + "
              f"{coarse.peak_rss_mb:.0f} MB peak), included in each IVF row's build s and peak RSS.")
    if best is not None:
        print(f"winner within {RAM_BUDGET_BYTES} B/vector: {best.name} ({best.factory}, {best.search_params}): "
              f"recall@10={best.recall10:.3f}, {best.bytes_per_vector:.1f} B/vec, {best.wiki_gb:.2f} GB at 21M, "
              f"QPS@64={best.qps['64']:.1f}")
        if fastest is not None and fastest is not best:
            print(f"fastest within {RAM_BUDGET_BYTES} B/vector at recall@10 >= {TARGET_RECALL}: {fastest.name} "
                  f"({fastest.search_params}): recall@10={fastest.recall10:.3f}, QPS@64={fastest.qps['64']:.1f}")
    else:
        print(f"no type within {RAM_BUDGET_BYTES} B/vector was run")
    if overall is not None:
        print(f"best recall@10 overall: {overall.name} ({overall.recall10:.3f}, {overall.bytes_per_vector:.1f} B/vec)")
    key = best.recall10 if best is not None else float("nan")
    result = {
        "args": {k: v for k, v in vars(args).items()},
        "generator": asdict(config),
        "nlist": nlist,
        "train_size": train_size,
        "shared_coarse": None if coarse is None else {
            "sample_seconds": sample_seconds, "sample_mb": sample_mb, "train_seconds": coarse.train_seconds,
            "assign_seconds": coarse.assign_seconds, "peak_rss_mb": coarse.peak_rss_mb},
        "skipped": skipped,
        "faiss_version": faiss.__version__,
        "threads": faiss.omp_get_max_threads(),
        "rows": [asdict(r) for r in rows],
        "winner_within_64B": None if best is None else best.name,
        "fastest_within_64B_at_target": None if fastest is None else fastest.name,
        "best_recall10_at_64B": key,
    }
    if args.out:
        write_json_atomic(result, args.out)
    print(f"best_recall10_at_64B={key:.4f}")
    return result


if __name__ == "__main__":
    main()
