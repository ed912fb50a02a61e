"""Benchmark the retrieval server: micro-batching versus one request at a time.

    python scripts/bench_server.py                      # 64 clients, 30 s per mode
    python scripts/bench_server.py --clients 64 --seconds 5

Starts ``envs.retrieval.server.RetrievalServer`` in this process on the embedded default index (MiniLM
over the Wikipedia summaries; built on first use, then cached), with the retriever's result cache
off so every query is really encoded and searched. The clients run in a child process, as remote
nodes would. ``--clients`` threads, each with its own httpx
connection, send one query per ``POST /search`` (k=5) for ``--seconds``, drawing from a pool of
short queries (the default corpus's article titles and descriptions; ``--queries questions`` for
the ~40-word default generated questions). It runs twice against the same server: micro-batching
(``max_batch=--max-batch``) and then ``max_batch=1`` (one request at a time), and prints, for each,
QPS, p50/p99 latency, errors, the mean batch size and the seconds spent encoding and searching
the index; the last line is
``microbatch_speedup=<QPS ratio>``.
"""
from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from envs.retrieval.server import RetrievalServer, ServerLimits  # noqa: E402


def query_pool(kind: str, n: int, seed: int = 0) -> list[str]:
    """Distinct queries. ``short``: the default corpus's article titles and short descriptions
    ("Mount Fuji", "Landlocked country in West Africa"), the length of an agent's search queries;
    ``questions``: the default generated questions (about 40 words each)."""
    if kind == "questions":
        from envs.default_questions import generate_default_questions

        return list(dict.fromkeys(e.question for e in generate_default_questions(n, seed=seed)))
    from envs.retrieval.default_corpus import default_articles_path, read_articles

    texts = []
    for article in read_articles(default_articles_path()):
        texts.append(article["title"])
        if len(str(article.get("description") or "").split()) >= 2:
            texts.append(article["description"])
    pool = list(dict.fromkeys(texts))
    random.Random(seed).shuffle(pool)
    return pool[:n]


def run_clients(url: str, pool: list[str], clients: int, seconds: float, k: int) -> dict:
    """``clients`` threads hammering ``/search`` for ``seconds``; latency percentiles, QPS, errors."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start_line = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            http.get("/health")  # connect before the clock starts
            start_line.wait()
            n = i
            while time.perf_counter() < stop_at[0]:
                query = pool[n % len(pool)]
                n += clients
                sent = time.perf_counter()
                try:
                    response = http.post("/search", json={"queries": [query], "k": k})
                    ok = response.status_code == 200 and len(response.json()["results"][0]) == k
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies[i].append(time.perf_counter() - sent)
                else:
                    errors[i] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + 3600  # set for real once every client is connected
    start_line.wait()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    done = sorted(t for per_client in latencies for t in per_client)
    return {
        "requests": len(done),
        "errors": sum(errors),
        "seconds": elapsed,
        "qps": len(done) / elapsed,
        "p50_ms": 1000 * statistics.median(done) if done else float("nan"),
        "p99_ms": 1000 * done[min(len(done) - 1, int(0.99 * len(done)))] if done else float("nan"),
    }


def measure(server: RetrievalServer, name: str, max_batch: int, pool: list[str], args) -> dict:
    server.batcher.max_batch = max_batch
    before = server.batcher.stats()
    stats = server.retriever.stats
    busy_before = stats.encode_seconds, stats.index_seconds
    # The clients run in a child process, as remote nodes would: they do not compete with the
    # server's threads for this process's GIL.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        result = child.submit(run_clients, server.url, pool, args.clients, args.seconds, args.k).result()
    after = server.batcher.stats()
    batches = after["batches"] - before["batches"]
    queries = after["batched_queries"] - before["batched_queries"]
    result["mean_batch"] = queries / batches if batches else 0.0
    encode_s, index_s = stats.encode_seconds - busy_before[0], stats.index_seconds - busy_before[1]
    print(f"{name}: max_batch={max_batch} clients={args.clients} seconds={result['seconds']:.1f} "
          f"requests={result['requests']} qps={result['qps']:.1f} p50_ms={result['p50_ms']:.1f} "
          f"p99_ms={result['p99_ms']:.1f} errors={result['errors']} mean_batch={result['mean_batch']:.1f} "
          f"encode_s={encode_s:.1f} index_s={index_s:.1f}",
          flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="per mode")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-batch", type=int, default=256, help="micro-batching mode's max_batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--queries", default="short", choices=["short", "questions"],
                        help="query pool: article titles and descriptions, or the default generated questions")
    parser.add_argument("--pool", type=int, default=20000, help="distinct queries in the pool (at most)")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for the encoder (default: torch's)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args(argv)

    from envs.retrieval.defaults import default_retriever

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    retriever = default_retriever(device=args.device, cache_size=0, show_progress=False)
    pool = query_pool(args.queries, args.pool)
    print(f"index: {retriever!r}; query pool: {len(pool)} {args.queries} queries; "
          f"cache off; k={args.k}", flush=True)
    limits = ServerLimits(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    with RetrievalServer(retriever, "127.0.0.1", 0, limits).start() as server:
        retriever.search(pool[:8], args.k)  # warm the encoder up
        batched = measure(server, "microbatch", args.max_batch, pool, args)
        single = measure(server, "one-at-a-time", 1, pool, args)
        served = server.served()
    print(f"server: {served}")
    speedup = batched["qps"] / single["qps"] if single["qps"] else float("inf")
    print(f"microbatch_speedup={speedup:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
