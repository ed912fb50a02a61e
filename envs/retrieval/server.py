"""Retrieval server: one index shared over HTTP by several training or evaluation nodes.

    python -m envs.retrieval.server --index indexes/wiki18-e5 --port 8000      # an index folder
    python -m envs.retrieval.server --index default                            # the embedded MiniLM index
    python -m envs.retrieval.server --index default --host 0.0.0.0             # other machines (no auth!)

Clients use :class:`envs.retrieval.remote.RemoteRetriever` (``--retriever http://host:8000`` in
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
import socket
import sys
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from envs.retrieval.defaults import open_retriever
from envs.retrieval.microbatch import MicroBatcher  # noqa: E402,F401  (re-exported)
from envs.retrieval.server_requests import (  # noqa: E402,F401  (re-exported)
    DEFAULT_K,
    ROUTES,
    SEARCH_R1_DEFAULT_TOPK,
    RequestError,
    ServerLimits,
    hit_json,
    parse_retrieve,
    parse_rows,
    parse_search,
    passage_json,
    search_r1_document,
    search_r1_result,
)
from envs.types import Hit

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

    def start(self) -> RetrievalServer:
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

    def __enter__(self) -> RetrievalServer:
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
    parser = argparse.ArgumentParser(prog="python -m envs.retrieval.server", description=__doc__,
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
