"""Results of scripts/bench_index.py: the row type, the table, the winner, the JSON and last line.

``Row`` is one table row (an index type as searched); ``format_row`` prints it under ``HEADER``;
``pick_winner`` chooses the best types within the RAM budget; ``report_results`` prints the final
table and summary, writes the results as JSON when asked, and ends with the key figure line
``best_recall10_at_64B=<x>``.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import faiss

from envs.atomic import write_json_atomic
from scripts.bench_index_build import SharedTraining
from scripts.bench_index_data import GeneratorConfig

WIKIPEDIA_PASSAGES = 21_015_324
RAM_BUDGET_BYTES = 64  # per vector, for the key figure
TARGET_RECALL = 0.90
BATCH_SIZES = (1, 64, 256)


@dataclass
class Row:
    """One index type as searched: build cost, RAM per vector, QPS per batch size, recall@10."""

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


HEADER = (f"{'type':<19} {'factory':<22} {'build s':>8} {'peak RSS MB':>11} {'B/vec':>8} {'21M GB':>7} "
          f"{'QPS@1':>8} {'QPS@64':>8} {'QPS@256':>8} {'R@10':>6}  notes")


def format_row(row: Row) -> str:
    """One line of the table under ``HEADER``."""
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


def print_summary(rows: list[Row], picks: tuple[Row | None, Row | None, Row | None],
                  args: argparse.Namespace, shared: SharedTraining | None) -> None:
    """The table again, what its columns mean, the shared IVF costs and the winners."""
    best, fastest, overall = picks
    print()
    print(HEADER)
    for row in rows:
        print(format_row(row))
    print(f"B/vec = serialised index size / rows indexed (what the index holds in RAM; the key figure counts "
          f"types with B/vec <= {RAM_BUDGET_BYTES}); 21M GB = fixed part (centroids, codebooks, rotation) + "
          f"per-vector part x {WIKIPEDIA_PASSAGES:,} ({RAM_BUDGET_BYTES} B/vector there = "
          f"{RAM_BUDGET_BYTES * WIKIPEDIA_PASSAGES / 1e9:.2f} GB); "
          f"QPS@1 on {min(args.batch1_queries, args.queries)} queries, "
          f"QPS@64/@256 on all {args.queries}; {faiss.omp_get_max_threads()} threads; peak RSS MB = increase "
          "during the build.")
    if shared is not None:
        coarse = shared.coarse
        print("IVF rows share one training sample, coarse quantizer and list assignment "
              f"({shared.sample_seconds:.1f} s + "
              f"{coarse.train_seconds:.1f} s + {coarse.assign_seconds:.1f} s, {shared.sample_mb:.0f} MB + "
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


def results_json(args: argparse.Namespace, config: GeneratorConfig, nlist: int, train_size: int,
                 shared: SharedTraining | None, skipped: list[str], rows: list[Row],
                 best: Row | None, fastest: Row | None) -> dict:
    """The run's settings and results as one JSON-ready dict; the key figure is
    ``best_recall10_at_64B`` (NaN when no type within the RAM budget was run)."""
    key = best.recall10 if best is not None else float("nan")
    coarse = None if shared is None else shared.coarse
    return {
        "args": {k: v for k, v in vars(args).items()},
        "generator": asdict(config),
        "nlist": nlist,
        "train_size": train_size,
        "shared_coarse": None if coarse is None else {
            "sample_seconds": shared.sample_seconds, "sample_mb": shared.sample_mb,
            "train_seconds": coarse.train_seconds, "assign_seconds": coarse.assign_seconds,
            "peak_rss_mb": coarse.peak_rss_mb},
        "skipped": skipped,
        "faiss_version": faiss.__version__,
        "threads": faiss.omp_get_max_threads(),
        "rows": [asdict(r) for r in rows],
        "winner_within_64B": None if best is None else best.name,
        "fastest_within_64B_at_target": None if fastest is None else fastest.name,
        "best_recall10_at_64B": key,
    }


def report_results(rows: list[Row], args: argparse.Namespace, config: GeneratorConfig, nlist: int,
                   train_size: int, shared: SharedTraining | None, skipped: list[str]) -> dict:
    """Print the summary, write the JSON to ``--out`` when given, and print the key figure last."""
    best, fastest, overall = pick_winner(rows)
    print_summary(rows, (best, fastest, overall), args, shared)
    result = results_json(args, config, nlist, train_size, shared, skipped, rows, best, fastest)
    key = result["best_recall10_at_64B"]
    if args.out:
        write_json_atomic(result, args.out)
    print(f"best_recall10_at_64B={key:.4f}")
    return result
