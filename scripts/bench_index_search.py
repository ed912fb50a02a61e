"""Searching the built indexes for scripts/bench_index.py: one table row per searched type.

``measure_rows`` sets the search parameters of one built index (nprobe, efSearch), then for the
type and each of its ``+rerank<k'>`` variants times the queries at every batch size in
``BATCH_SIZES``, scores recall@10 against the exact top-10 and prints the row as it goes.
Re-ranking re-scores the candidates exactly from the memory-mapped float32 file.
"""
from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from envs.retrieval.rerank import rerank_exact
from scripts.bench_index_build import rerank_depth
from scripts.bench_index_data import K, RowReader
from scripts.bench_index_measure import recall_at_k, time_search
from scripts.bench_index_report import BATCH_SIZES, WIKIPEDIA_PASSAGES, Row, format_row


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
            wiki_gb=(build["fixed_bytes"]
                     + (build["bytes"] - build["fixed_bytes"]) / build["rows"] * WIKIPEDIA_PASSAGES) / 1e9,
            qps={str(b): q for b, q in qps.items()},
            recall10=recall_at_k(found, truth),
            search_params=params + (f", k'={rerank}" if rerank else ""),
            note=note,
        ))
        print(format_row(rows[-1]), flush=True)
    return rows
