"""Benchmark the retrieval server's engines side by side under the same load.

    python scripts/bench_server.py                          # 64 clients, 20 s per mode
    python scripts/bench_server.py --clients 64 --seconds 10 --engines uvicorn,ray

One run measures, on the embedded default index (MiniLM over the Wikipedia summaries; built on
first use, then cached) with the retriever's result cache off so every query is really encoded
and searched: the uvicorn engine with batching (``max_batch=--max-batch``), the same server one
request at a time (``max_batch=1``), and the Ray Serve engine with one replica (``@serve.batch``;
skipped, with a note, without the ``ray`` extra). The clients run in a child process, as remote
nodes would: ``--clients`` threads, each with its own httpx connection, send one query per
``POST /search`` (k=5) for ``--seconds``, drawing from a pool of short queries (the default
corpus's article titles and descriptions; ``--queries questions`` for the ~40-word default
generated questions). Each mode prints QPS, p50/p99 latency, errors and the mean batch (from the
server's ``/health``); the last line is ``errors=<all modes> microbatch_speedup=<uvicorn batched
QPS / one-at-a-time QPS>``.

``--engines fairness`` (default limits): ``--small-clients`` clients sending one short query each,
alone, then beside one client sending the largest valid request again and again (every query at
``max_query_chars``, as many as ``max_queries_per_request``, ``k`` at ``max_hits_per_request``),
then beside that and ``--abusers`` clients of each abuse (1 MB headers, slowloris heads at a byte
per 0.5 s, idle connections). The last line then adds ``small_p99_ms=`` (alone),
``small_p99_beside_maximal_ms=``, ``small_p99_under_abuse_ms=`` and ``abuse_served=`` (abusive
requests the server answered 200: 0); ``errors=`` counts every normal and maximal request.
"""
from __future__ import annotations

import argparse
import multiprocessing
import random
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from envs.default_questions import generate_default_questions
from envs.retrieval import serve_ray
from envs.retrieval.default_corpus import default_articles_path, read_articles
from envs.retrieval.defaults import default_retriever
from envs.retrieval.server import RetrievalServer, ServerLimits


def query_pool(kind: str, n: int, seed: int = 0) -> list[str]:
    """Distinct queries. ``short``: the default corpus's article titles and short descriptions
    ("Mount Fuji", "Landlocked country in West Africa"), the length of an agent's search queries;
    ``questions``: the default generated questions (about 40 words each)."""
    if kind == "questions":
        return list(dict.fromkeys(e.question for e in generate_default_questions(n, seed=seed)))
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


def maximal_body(limits: ServerLimits) -> dict:
    """The largest request the server accepts: every query at its length cap, k at the hits cap."""
    n, chars = limits.max_queries_per_request, limits.max_query_chars
    queries = [(f"{i} maximal query " * chars)[:chars] for i in range(n)]
    return {"queries": queries, "k": max(1, min(limits.max_k, limits.max_hits_per_request // n))}


def run_maximal(url: str, body: dict, seconds: float) -> dict:
    """One client sending the maximal request again and again for ``seconds``."""
    latencies, errors = [], 0
    stop_at = time.perf_counter() + seconds
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as http:
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            try:
                ok = http.post("/search", json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - sent)
            errors += not ok
    return {"requests": len(latencies), "errors": errors, "mean_s": statistics.fmean(latencies) if latencies else 0}


def _abuse_thread(kind: str, port: int, stop_at: float, tally: dict, lock: threading.Lock) -> None:
    """One abuser until ``stop_at``: ``header`` sends 1 MB headers; ``slow`` a head at a byte per
    0.5 s; ``idle`` connects and sends nothing. Counts what the server did to it."""
    head = b"POST /search HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    while time.perf_counter() < stop_at:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=max(1.0, stop_at - time.perf_counter())) as sock:
                if kind == "header":
                    try:
                        sock.sendall(head)
                    except OSError:
                        pass
                elif kind == "slow":
                    for byte in b"POST /search HTTP/1.1\r\nhost: x\r\n" + b"x" * 10_000:
                        if time.perf_counter() > stop_at:
                            break
                        sock.sendall(bytes([byte]))
                        time.sleep(0.5)
                answer = sock.recv(64)
        except TimeoutError:
            answer = b"still open"
        except OSError:
            answer = b""  # reset: dropped
        outcome = "served" if answer.startswith(b"HTTP/1.1 200") else "open" if answer == b"still open" else "dropped"
        with lock:
            tally[f"{kind}_{outcome}"] = tally.get(f"{kind}_{outcome}", 0) + 1


def run_abusers(url: str, seconds: float, per_kind: int) -> dict:
    """``per_kind`` large-header, slowloris and idle clients each, for ``seconds``; their tally."""
    port, stop_at = int(url.rsplit(":", 1)[1]), time.perf_counter() + seconds
    tally, lock = {}, threading.Lock()
    threads = [threading.Thread(target=_abuse_thread, args=(kind, port, stop_at, tally, lock), daemon=True)
               for kind in ("header", "slow", "idle") for _ in range(per_kind)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return tally


def measure_fairness(pool: list[str], args) -> dict:
    """Small requests alone, beside one client sending maximal requests, and beside maximal requests
    plus the abuse mix (large headers, slowloris heads, idle connections); default limits."""
    retriever = default_retriever(device=args.device, cache_size=0, show_progress=False)
    limits = ServerLimits(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    body = maximal_body(limits)
    out = {}
    with RetrievalServer(retriever, "127.0.0.1", 0, limits).start() as server:
        retriever.search(pool[:8], args.k)
        small = argparse.Namespace(**{**vars(args), "clients": args.small_clients})
        out["alone"] = measure(server.url, "small-alone", pool, small, f"k={args.k} ")
        for name, abuse in (("beside-maximal", 0), ("beside-maximal-and-abuse", args.abusers)):
            with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as heavy:
                maximal = heavy.submit(run_maximal, server.url, body, args.seconds)
                abusers = heavy.submit(run_abusers, server.url, args.seconds, abuse) if abuse else None
                out[name] = measure(server.url, f"small-{name}", pool, small, f"k={args.k} ")
                out[name]["maximal"] = maximal.result()
                out[name]["abuse"] = abusers.result() if abusers else {}
            print(f"  maximal client ({len(body['queries'])} queries x {len(body['queries'][0])} chars, "
                  f"k={body['k']}): {out[name]['maximal']}" + (f"; abusers: {out[name]['abuse']}" if abuse else ""),
                  flush=True)
    return out


def measure(url: str, name: str, pool: list[str], args, note: str = "") -> dict:
    """One mode: the clients (in a child process) against ``url``; the mean batch from ``/health``."""
    before = httpx.get(f"{url}/health", trust_env=False, timeout=60).json()["served"]
    # The clients run in a child process, as remote nodes would: they do not compete with the
    # server's threads for this process's GIL.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        result = child.submit(run_clients, url, pool, args.clients, args.seconds, args.k).result()
    after = httpx.get(f"{url}/health", trust_env=False, timeout=60).json()["served"]
    batches = after.get("batches", 0) - before.get("batches", 0)
    queries = after.get("batched_queries", 0) - before.get("batched_queries", 0)
    result["mean_batch"] = queries / batches if batches else 0.0
    print(f"{name}: {note}clients={args.clients} seconds={result['seconds']:.1f} requests={result['requests']} "
          f"qps={result['qps']:.1f} p50_ms={result['p50_ms']:.1f} p99_ms={result['p99_ms']:.1f} "
          f"errors={result['errors']} mean_batch={result['mean_batch']:.1f}", flush=True)
    return result


def measure_uvicorn(pool: list[str], args) -> tuple[dict, dict]:
    """The uvicorn engine in this process: batched, then one request at a time on the same server."""
    retriever = default_retriever(device=args.device, cache_size=0, show_progress=False)
    print(f"index: {retriever!r}; query pool: {len(pool)} {args.queries} queries; cache off; k={args.k}", flush=True)
    limits = ServerLimits(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    with RetrievalServer(retriever, "127.0.0.1", 0, limits).start() as server:
        retriever.search(pool[:8], args.k)  # warm the encoder up
        batched = measure(server.url, "uvicorn-batched", pool, args, f"max_batch={args.max_batch} ")
        server.batcher.max_batch = 1
        single = measure(server.url, "uvicorn-one-at-a-time", pool, args, "max_batch=1 ")
    return batched, single


def measure_ray(pool: list[str], args) -> dict | None:
    """The Ray Serve engine, one replica holding the default index, on a local Ray of ``--ray-cpus``."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print("ray-serve: skipped (pip install -e '.[ray]' for the Ray Serve engine)", flush=True)
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    try:
        limits = ServerLimits(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
        options = serve_ray.ReplicaOptions(replicas=1, num_cpus=args.ray_cpus)
        url = serve_ray.run(serve_ray.application("default", None, args.device, limits, None, options, cache_size=0),
                            "127.0.0.1", port)
        httpx.post(f"{url}/search", json={"queries": pool[:8], "k": args.k}, trust_env=False, timeout=120)  # warm up
        return measure(url, "ray-serve-1-replica", pool, args, f"max_batch={args.max_batch} ")
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0, help="per mode")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-batch", type=int, default=256, help="batched modes' max_batch (queries)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--engines", default="uvicorn,ray", help="comma-separated: uvicorn, ray, fairness (small "
                        "requests alone, beside a client sending maximal requests, and beside that plus the abuse mix)")
    parser.add_argument("--small-clients", type=int, default=8, help="fairness: clients sending one query each")
    parser.add_argument("--abusers", type=int, default=20, help="fairness: large-header, slowloris and idle clients "
                                                                "(each kind)")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray, all for the one replica")
    parser.add_argument("--queries", default="short", choices=["short", "questions"],
                        help="query pool: article titles and descriptions, or the default generated questions")
    parser.add_argument("--pool", type=int, default=20000, help="distinct queries in the pool (at most)")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for the encoder (default: torch's)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args(argv)
    engines = {e.strip() for e in args.engines.split(",") if e.strip()}
    if not engines or engines - {"uvicorn", "ray", "fairness"}:
        parser.error(f"--engines takes uvicorn, ray and/or fairness, got {args.engines!r}")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    pool = query_pool(args.queries, args.pool)
    results = []
    speedup = float("nan")
    if "uvicorn" in engines:
        batched, single = measure_uvicorn(pool, args)
        results += [batched, single]
        speedup = batched["qps"] / single["qps"] if single["qps"] else float("inf")
    if "ray" in engines:
        results += [r for r in [measure_ray(pool, args)] if r is not None]
    fair = ""
    if "fairness" in engines:
        runs = measure_fairness(pool, args)
        mixed = runs["beside-maximal-and-abuse"]
        results += list(runs.values()) + [r["maximal"] for r in runs.values() if "maximal" in r]
        fair = (f" small_p99_ms={runs['alone']['p99_ms']:.1f} small_p99_beside_maximal_ms="
                f"{runs['beside-maximal']['p99_ms']:.1f} small_p99_under_abuse_ms={mixed['p99_ms']:.1f} "
                f"abuse_served={sum(v for k, v in mixed['abuse'].items() if k.endswith('_served'))}")
    print(f"errors={sum(r['errors'] for r in results)} microbatch_speedup={speedup:.2f}{fair}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
