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
for k' candidates, re-scored exactly by envs.retrieval.rerank.rerank_exact from the float32 file,
memory-mapped; its RAM figure is the compressed index only; ``<pq type>+rerank`` means one row per
depth in ``--rerank``, 200 and 500 by default). Inner product on L2-normalised vectors, as
envs/retrieval/index.py builds them; nlist defaults to the power of two nearest 4*sqrt(n). IVF-PQ indexes
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

# This file is the CLI and the main flow. The parts live beside it in scripts/:
#   bench_index_data.py     synthetic vectors (generator, row reader) and the exact top-k
#   bench_index_measure.py  peak RSS, serialised index size, search timing, recall@k
#   bench_index_build.py    the index types and how each is built (shared IVF training)
#   bench_index_search.py   searching a built index: QPS and recall, one row per type
#   bench_index_report.py   the result rows, the table, the winner, the JSON and the last line
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

# rerank_depth, recall_at_k, BATCH_SIZES, RAM_BUDGET_BYTES and WIKIPEDIA_PASSAGES are not used here:
# they are imported so that ``bench_index.<name>`` keeps working for tests and callers.

from scripts.bench_index_build import (  # noqa: E402, F401
    DEFAULT_TYPES,
    INDEX_TYPES,
    RERANKABLE,
    SharedTraining,
    build_index_type,
    default_nlist,
    pq_fits,
    rerank_depth,
    train_shared,
)
from scripts.bench_index_data import GeneratorConfig, K, RowReader, exact_top_k, generate, make_queries  # noqa: E402
from scripts.bench_index_measure import (  # noqa: E402, F401
    recall_at_k,
    release_free_memory,
    serialised_bytes,
)
from scripts.bench_index_report import (  # noqa: E402, F401
    BATCH_SIZES,
    HEADER,
    RAM_BUDGET_BYTES,
    WIKIPEDIA_PASSAGES,
    Row,
    report_results,
)
from scripts.bench_index_search import measure_rows  # noqa: E402


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
    parser.add_argument("--hnsw-n", type=int, default=None,
                        help="build HNSW on the first this many rows (default: all)")
    parser.add_argument("--batch1-queries", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--flat-batch1-queries", type=int, default=20, help="the same for Flat (a full scan each)")
    parser.add_argument("--clusters", type=int, default=GeneratorConfig.clusters, help="mixture components")
    parser.add_argument("--latent-dim", type=int, default=GeneratorConfig.latent_dim,
                        help="rank of the structured part")
    parser.add_argument("--workdir", default=None,
                        help="where vectors.npy goes (default: a temp dir, removed at the end)")
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


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark from command-line arguments; returns the results dict printed and saved."""
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
    """Data and ground truth, the shared IVF training, every requested index type, then the report."""
    n, dim = args.n, args.dim
    nlist = args.nlist or default_nlist(n)
    train_size = min(n, args.train_size or max(100_000, 39 * nlist))
    config = GeneratorConfig(dim=dim, seed=args.seed, clusters=args.clusters, latent_dim=args.latent_dim)
    path = workdir / "vectors.npy"
    depths = ",".join(map(str, args.rerank)) or "none"
    print(f"n={n} dim={dim} queries={args.queries} seed={args.seed} nlist={nlist} nprobe={min(args.nprobe, nlist)} "
          f"train_size={train_size} opq_iters={args.opq_iters} rerank_k'={depths} hnsw_n={min(args.hnsw_n or n, n)} "
          f"faiss={faiss.__version__} threads={faiss.omp_get_max_threads()}", flush=True)
    reader, queries, truth = prepare_vectors(path, config, n, args.queries)
    wanted, skipped = group_by_index(args.types, dim)

    shared = None
    if any(INDEX_TYPES[b].startswith(("IVF", "OPQ")) for b in wanted):
        shared = train_shared(reader, n, train_size, args.seed, nlist)
        coarse = shared.coarse
        print(f"shared by the IVF rows: training sample of {len(shared.sample)} rows ({shared.sample_mb:.0f} MB, "
              f"read in {shared.sample_seconds:.1f} s), coarse quantizer IVF{nlist} (k-means "
              f"{coarse.train_seconds:.1f} s, peak RSS +{coarse.peak_rss_mb:.0f} MB), list of each of the {n} rows "
              f"({coarse.assign_seconds:.1f} s); every IVF row's build s and peak RSS include them", flush=True)

    print(HEADER, flush=True)
    rows: list[Row] = []
    scratch = workdir / "index.scratch"
    for base, names in ((b, wanted[b]) for b in INDEX_TYPES if b in wanted):
        rows += build_and_measure(base, names, nlist, reader, queries, truth, shared, args, scratch, path)
        release_free_memory()  # the index built for this type is gone by now
    return report_results(rows, args, config, nlist, train_size, shared, skipped)


def prepare_vectors(path: Path, config: GeneratorConfig, n: int,
                    n_queries: int) -> tuple[RowReader, np.ndarray, np.ndarray]:
    """Generate (or reuse) the base rows, draw the queries and find their exact top-K."""
    started = time.perf_counter()
    made = generate(path, n, config)
    print(f"data: {path} ({'generated' if made else 'reused'}, {time.perf_counter() - started:.1f} s); {config}",
          flush=True)
    reader = RowReader(path)
    queries = make_queries(n_queries, config)
    started = time.perf_counter()
    truth = exact_top_k(reader, queries, K)
    print(f"ground truth: exact top-{K} of {n_queries} queries in {time.perf_counter() - started:.1f} s", flush=True)
    return reader, queries, truth


def group_by_index(types: list[str], dim: int) -> tuple[dict[str, list[str]], list[str]]:
    """The requested names grouped by the index they need, minus the PQ types whose m does not
    divide ``dim`` (returned second, each reported as skipped)."""
    wanted = {}
    for name in types:
        wanted.setdefault(name.partition("+rerank")[0], []).append(name)
    skipped = [b for b in wanted if not pq_fits(INDEX_TYPES[b], dim)]
    for base in skipped:
        print(f"skipping {wanted.pop(base)}: {INDEX_TYPES[base]} needs m to divide dim={dim}")
    return wanted, skipped


def build_and_measure(base: str, names: list[str], nlist: int, reader: RowReader, queries: np.ndarray,
                      truth: np.ndarray, shared: SharedTraining | None, args: argparse.Namespace,
                      scratch: Path, embeddings_path: Path) -> list[Row]:
    """Build the index ``base`` needs, then search it as each of ``names`` (printing each row)."""
    n = reader.n
    built = build_index_type(base, nlist, reader, args.hnsw_n, shared, scratch, args.opq_iters)
    rows_indexed, base_truth, note = built.rows_indexed, truth, ""
    if rows_indexed < n:
        base_truth = exact_top_k(reader, queries, K, stop=rows_indexed)
        note = f"built on the first {rows_indexed} of {n} rows; QPS and recall on that subset"
    build = {"factory": built.factory, "rows": rows_indexed, "seconds": built.seconds,
             "peak_rss_mb": built.peak_rss_mb, "bytes": serialised_bytes(built.index, scratch),
             "fixed_bytes": built.fixed_bytes, "note": note}
    return measure_rows(names, built.index, reader, queries, base_truth, args, build, embeddings_path)


if __name__ == "__main__":
    main()
