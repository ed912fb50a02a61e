"""Retrieval server: one index shared over HTTP by several training or evaluation nodes.

    python -m envs.server --index indexes/wiki18-e5 --port 8000      # an index folder
    python -m envs.server --index default                            # the embedded MiniLM index
    python -m envs.server --index default --host 0.0.0.0             # other machines (no auth!)

Clients use :class:`envs.remote.RemoteRetriever` (``--retriever http://host:8000`` in
``inference.evaluate``, ``retriever: http://host:8000`` in the training configs). JSON only:

- ``POST /search``   ``{"queries": [...], "k": 5}`` ->
  ``{"results": [[{"id", "title", "text", "score", "rank", "row"}, ...] per query]}``
- ``POST /retrieve`` Search-R1's request and response (see :func:`search_r1_result`)
- ``POST /passages`` ``{"rows": [...]}`` -> ``{"passages": [{"row", "id", "title", "text"}, ...]}``
- ``GET /health``    size, encoder, index type, limits and served-request counters.

Micro-batching: the queries of concurrent requests wait in one queue; a single worker thread
takes all that is waiting (up to ``max_batch`` queries, waiting at most ``max_wait_ms`` after the
first for more) and answers them with ONE ``retriever.search`` call, i.e. one encode and one index
search (one per distinct ``k``, if clients ask for different ones), then hands each request
exactly its own rows. ``--max-batch 1`` serves one request at a
time. Bad requests get a 4xx and ``{"error": reason}``; a failure inside the retriever gets a 500
and the server keeps running. Bodies are parsed with ``json`` only (never eval or pickle).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import queue
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from envs.types import Hit, Passage

DEFAULT_K = 5  # /search without "k" (the env's K)
SEARCH_R1_DEFAULT_TOPK = 3  # /retrieve without "topk" (Search-R1's retrieval_server.py --topk default)
ROUTES = {"/search": "POST", "/retrieve": "POST", "/passages": "POST", "/health": "GET"}


@dataclass
class ServerLimits:
    """Batching and request caps (the command-line flags of the same names)."""

    max_batch: int = 256  # queries per retriever call; 1 = one request at a time
    max_wait_ms: float = 5.0  # how long the worker waits for more requests after the first
    max_queries_per_request: int = 256
    max_k: int = 100
    max_body_bytes: int = 4 << 20
    max_rows_per_request: int = 1024  # /passages

    def __post_init__(self):
        for name in ("max_batch", "max_queries_per_request", "max_k", "max_body_bytes", "max_rows_per_request"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with a reason for the client."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


# ============================================================================== micro-batching


@dataclass
class _Job:
    queries: list[str]
    k: int
    done: threading.Event = field(default_factory=threading.Event)
    hits: list[list[Hit]] | None = None
    error: BaseException | None = None


class MicroBatcher:
    """Merges the searches of concurrent callers into one ``retriever.search`` call per batch.

    ``search(queries, k)`` blocks until the worker has answered it. A batch holds whole requests
    (at least one, more while the total stays within ``max_batch`` queries) and makes one
    ``retriever.search`` call per distinct ``k`` among them: normally exactly one, since every
    env asks for its ``top_k``. (Searching once with the largest ``k`` and cutting would save a
    call for mixed ``k``, but FAISS orders tied scores, e.g. of duplicate passages, differently
    for different ``k``, and a remote search must equal the local one.) Each request gets
    exactly its own rows. ``max_batch`` may be changed while the worker runs.
    """

    def __init__(self, retriever, max_batch: int = 256, max_wait_ms: float = 5.0):
        self.retriever = retriever
        self.max_batch = int(max_batch)
        self.max_wait_ms = float(max_wait_ms)
        self.batches = 0  # retriever calls made
        self.batched_queries = 0
        self.largest_batch = 0
        self.failed_batches = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._carry: _Job | None = None  # a job that did not fit the previous batch
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self._closed:
            raise RuntimeError("the retrieval server is shutting down")
        job = _Job(list(queries), int(k))
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.hits

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=10)

    def stats(self) -> dict:
        return {"batches": self.batches, "batched_queries": self.batched_queries,
                "largest_batch": self.largest_batch, "failed_batches": self.failed_batches,
                "mean_batch": round(self.batched_queries / self.batches, 2) if self.batches else 0.0}

    # -- worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            jobs, stop = self._take_batch()
            if jobs:
                self._serve(jobs)
            if stop:
                break
        while True:  # fail whatever arrived after close()
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.error = RuntimeError("the retrieval server is shutting down")
                job.done.set()

    def _take_batch(self) -> tuple[list[_Job], bool]:
        """Everything waiting, up to ``max_batch`` queries; waits up to ``max_wait_ms`` for more."""
        first, self._carry = self._carry, None
        if first is None:
            first = self._queue.get()
            if first is None:
                return [], True
        jobs, size = [first], len(first.queries)
        deadline = time.monotonic() + self.max_wait_ms / 1000
        while size < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            if size + len(job.queries) > self.max_batch:
                self._carry = job  # first in the next batch
                break
            jobs.append(job)
            size += len(job.queries)
        return jobs, False

    def _serve(self, jobs: list[_Job]) -> None:
        by_k: dict[int, list[_Job]] = {}
        for job in jobs:
            by_k.setdefault(job.k, []).append(job)
        for k, group in by_k.items():
            queries = [q for job in group for q in job.queries]
            try:
                results = self.retriever.search(queries, k)
                if len(results) != len(queries):
                    raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
                start = 0
                for job in group:
                    job.hits = results[start : start + len(job.queries)]
                    start += len(job.queries)
            except Exception as err:  # every caller of the batch gets the error; the worker lives on
                self.failed_batches += 1
                for job in group:
                    job.error = err
            finally:
                self.batches += 1
                self.batched_queries += len(queries)
                self.largest_batch = max(self.largest_batch, len(queries))
                for job in group:
                    job.done.set()


# ============================================================================== request parsing


def _positive_int(value: Any, name: str, cap: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"{name} must be a positive integer, got {json.dumps(value)}")
    if value > cap:
        raise RequestError(400, f"{name}={value} is over the server's cap of {cap}")
    return value


def _queries(body: dict, limits: ServerLimits, allow_empty_strings: bool = False) -> list[str]:
    if "queries" not in body:
        raise RequestError(400, "missing field 'queries' (a list of strings)")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise RequestError(400, f"'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > limits.max_queries_per_request:
        raise RequestError(413, f"{len(queries)} queries in one request; the server's cap is "
                                f"{limits.max_queries_per_request} (split the request)")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(400, f"queries[{i}] must be a string, got {type(query).__name__}")
        if not allow_empty_strings and not query.strip():
            raise RequestError(400, f"queries[{i}] is empty")
    return queries


def parse_search(body: dict, limits: ServerLimits) -> tuple[list[str], int]:
    """``/search``: ``(queries, k)``."""
    return _queries(body, limits), _positive_int(body.get("k", DEFAULT_K), "k", limits.max_k)


def parse_retrieve(body: dict, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """``/retrieve`` (Search-R1): ``(queries, topk, return_scores)``.

    Empty query strings are accepted here (they get an empty result list): Search-R1's agent sends
    the stripped text of every ``<search></search>`` in a batch, so one empty tag must not fail
    the whole batch. A missing or null ``topk`` means 3, like Search-R1's server.
    """
    queries = _queries(body, limits, allow_empty_strings=True)
    topk = body.get("topk")
    topk = SEARCH_R1_DEFAULT_TOPK if topk is None else _positive_int(topk, "topk", limits.max_k)
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(400, f"'return_scores' must be true or false, got {json.dumps(return_scores)}")
    return queries, topk, return_scores


def parse_rows(body: dict, limits: ServerLimits, n_passages: int) -> list[int]:
    """``/passages``: corpus rows, each in ``0 .. n_passages-1``."""
    rows = body.get("rows")
    if not isinstance(rows, list):
        raise RequestError(400, "'rows' must be a list of corpus row numbers")
    if len(rows) > limits.max_rows_per_request:
        raise RequestError(413, f"{len(rows)} rows in one request; the server's cap is {limits.max_rows_per_request}")
    for i, row in enumerate(rows):
        if isinstance(row, bool) or not isinstance(row, int):
            raise RequestError(400, f"rows[{i}] must be an integer, got {json.dumps(row)}")
        if not 0 <= row < n_passages:
            raise RequestError(400, f"rows[{i}]={row} is out of range for a corpus of {n_passages} passages")
    return rows


# ============================================================================== response shapes


def hit_json(hit: Hit) -> dict:
    return {"id": hit.id, "title": hit.title, "text": hit.text, "score": hit.score, "rank": hit.rank, "row": hit.row}


def passage_json(passage: Passage) -> dict:
    return {"row": passage.row, "id": passage.id, "title": passage.title, "text": passage.text}


def search_r1_document(hit: Hit) -> dict:
    """A corpus row as Search-R1 stores it: wiki-18.jsonl's ``{"id", "contents": '"Title"\\ntext'}``."""
    return {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'}


def search_r1_result(hits_per_query: list[list[Hit]], return_scores: bool) -> dict:
    """Search-R1's ``/retrieve`` response, ``{"result": [per query: [...]]}``.

    Matched against PeterGriffinJin/Search-R1: ``search_r1/search/retrieval_server.py``
    (``retrieve_endpoint`` appends ``{"document": doc, "score": score}`` per hit when
    ``return_scores``, else the bare documents) and the agent that reads it,
    ``search_r1/llm_agent/generation.py`` (``_batch_search(...)['result']``, then
    ``doc_item['document']['contents']``, title = first line, text = the rest);
    ``search_r1/search/retrieval_request.py`` shows the request ``{"queries", "topk", "return_scores"}``.
    """
    if return_scores:
        return {"result": [[{"document": search_r1_document(h), "score": h.score} for h in hits]
                           for hits in hits_per_query]}
    return {"result": [[search_r1_document(h) for h in hits] for hits in hits_per_query]}


# ============================================================================== the server


class RetrievalServer(ThreadingHTTPServer):
    """HTTP front of a retriever (anything with ``search(queries, k)`` and ``corpus``).

    ``port=0`` binds a free port (read it from ``server.port``). ``start()`` serves from a
    background thread (tests, benchmarks); ``serve_forever()`` from the caller's.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512  # many clients connect at once; the default backlog (5) drops SYNs

    def __init__(self, retriever, host: str = "127.0.0.1", port: int = 8000,
                 limits: ServerLimits | None = None, verbose: bool = False):
        self.retriever = retriever
        self.limits = limits or ServerLimits()
        self.verbose = verbose
        self.batcher = MicroBatcher(retriever, self.limits.max_batch, self.limits.max_wait_ms)
        self._counts: dict[str, int] = {}
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if ":" in host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((host, port), _Handler)
        except BaseException:
            self.batcher.close()
            raise

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def start(self) -> "RetrievalServer":
        self._thread = threading.Thread(target=self.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (from another thread than ``serve_forever``'s), free the port, stop the worker."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self.server_close()
        self.batcher.close()

    def __enter__(self) -> "RetrievalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- counters --------------------------------------------------------------------------------

    def count(self, name: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def served(self) -> dict:
        with self._count_lock:
            counts = dict(self._counts)
        stats = getattr(self.retriever, "stats", None)
        if stats is not None and hasattr(stats, "calls"):
            counts["retriever_calls"] = stats.calls
        return {**counts, **self.batcher.stats()}

    # -- endpoints ---------------------------------------------------------------------------------

    def health(self) -> dict:
        encoder, index = getattr(self.retriever, "encoder", None), getattr(self.retriever, "index", None)
        meta = getattr(index, "meta", None) or {}
        return {
            "status": "ok",
            "passages": len(self.retriever.corpus),
            "encoder": getattr(encoder, "name", None),
            "index_type": meta.get("factory"),
            "dim": getattr(index, "dim", None) or getattr(encoder, "dim", None),
            "backend": getattr(index, "backend", None),
            **asdict(self.limits),
            "served": self.served(),
        }

    def search(self, body: dict) -> dict:
        queries, k = parse_search(body, self.limits)
        return {"results": [[hit_json(h) for h in hits] for hits in self._search(queries, k)]}

    def retrieve(self, body: dict) -> dict:
        queries, topk, return_scores = parse_retrieve(body, self.limits)
        asked = [i for i, q in enumerate(queries) if q.strip()]
        found = self._search([queries[i] for i in asked], topk)
        hits: list[list[Hit]] = [[] for _ in queries]
        for i, result in zip(asked, found):
            hits[i] = result
        return search_r1_result(hits, return_scores)

    def passages(self, body: dict) -> dict:
        corpus = self.retriever.corpus
        rows = parse_rows(body, self.limits, len(corpus))
        found = corpus.get_many(rows) if hasattr(corpus, "get_many") else [corpus[r] for r in rows]
        self.count("passages", len(rows))
        return {"passages": [passage_json(p) for p in found]}

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        self.count("queries", len(queries))
        try:
            return self.batcher.search(queries, k)
        except Exception as err:
            raise RequestError(500, f"retrieval failed: {type(err).__name__}: {err}") from err


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse their connections
    server_version = "seeds-rl-retrieval/1"
    timeout = 300  # seconds an idle keep-alive connection holds its thread
    server: RetrievalServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        server = self.server
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            if path not in ROUTES:
                raise RequestError(404, f"unknown path {path}; endpoints: "
                                        + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))
            if method != ROUTES[path]:
                raise RequestError(405, f"{path} takes {ROUTES[path]}, not {method}", {"Allow": ROUTES[path]})
            server.count("requests" + path.replace("/", "_"))
            if path == "/health":
                status, payload, headers = 200, server.health(), {}
            else:
                status, payload, headers = 200, getattr(server, path[1:])(self._read_json()), {}
        except RequestError as err:
            server.count("errors_5xx" if err.status >= 500 else "errors_4xx")
            status, payload, headers = err.status, {"error": err.reason}, err.headers
        except (ConnectionError, TimeoutError):  # the client went away mid-body
            self.close_connection = True
            return
        except Exception as err:  # a bug or a broken corpus: report it, keep serving
            server.count("errors_5xx")
            status, payload, headers = 500, {"error": f"internal error: {type(err).__name__}: {err}"}, {}
        try:
            self._send(status, payload, headers)
        except ConnectionError:  # the client went away before its answer
            self.close_connection = True

    def _read_json(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise RequestError(411, "chunked bodies are not supported; send Content-Length")
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(411, "a JSON body with a Content-Length header is required")
        try:
            length = int(length)
            if length < 0:
                raise ValueError
        except ValueError:
            raise RequestError(400, f"bad Content-Length {length!r}") from None
        if length > self.server.limits.max_body_bytes:
            raise RequestError(413, f"body of {length} bytes is over the server's cap of "
                                    f"{self.server.limits.max_body_bytes} bytes")
        raw = self.rfile.read(length)
        self._body_read = True
        try:
            body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as err:
            raise RequestError(400, f"body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise RequestError(400, f"body must be a JSON object, got {type(body).__name__}")
        return body

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        try:
            data = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except ValueError as err:
            status, data = 500, json.dumps({"error": f"response not serialisable: {err}"}).encode()
        # A body we did not read would be taken for the next request on this connection: close it.
        unread = not self._body_read and (self.headers.get("Content-Length", "0").strip() not in ("", "0")
                                          or "Transfer-Encoding" in self.headers)
        if unread:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if unread:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own refusals (bad request line, unsupported method ...), as JSON."""
        self._body_read = False
        self.close_connection = True
        reason = message or self.responses.get(code, ("error",))[0]
        data = json.dumps({"error": reason}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


# ============================================================================== command line


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m envs.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    limits = ServerLimits()
    parser.add_argument("--index", default="default",
                        help="index folder from scripts/build_index.py, or 'default' (the embedded MiniLM index)")
    parser.add_argument("--corpus", help="corpus file, when it moved since the index was built")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="index (and encoder) device")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default loopback only; 0.0.0.0 serves every network, without auth)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=limits.max_batch,
                        help="queries per retriever call (1: one request at a time)")
    parser.add_argument("--max-wait-ms", type=float, default=limits.max_wait_ms,
                        help="how long a batch waits for more requests after its first")
    parser.add_argument("--max-queries-per-request", type=int, default=limits.max_queries_per_request)
    parser.add_argument("--max-k", type=int, default=limits.max_k)
    parser.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes)
    parser.add_argument("--max-rows-per-request", type=int, default=limits.max_rows_per_request)
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = ServerLimits(args.max_batch, args.max_wait_ms, args.max_queries_per_request, args.max_k,
                              args.max_body_bytes, args.max_rows_per_request)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if not is_loopback(args.host):
        print(f"WARNING: binding {args.host}: anyone who can reach port {args.port} can query this index "
              "(there is no authentication); use --host 127.0.0.1 unless the network is trusted",
              file=sys.stderr)
    from envs.defaults import open_retriever

    if str(args.index).startswith(("http://", "https://")):
        raise SystemExit("error: --index must be an index folder or 'default', not a URL")
    retriever = open_retriever(args.index, corpus=args.corpus, device=args.device)
    server = RetrievalServer(retriever, args.host, args.port, limits, verbose=args.verbose)
    print(f"serving {retriever!r} on {server.url} (max_batch={limits.max_batch}, "
          f"max_wait_ms={limits.max_wait_ms:g}); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
