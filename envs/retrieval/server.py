"""Retrieval server: one index shared over HTTP by several training or evaluation nodes.

    python -m envs.retrieval.server --index indexes/wiki18-e5 --port 8000     # uvicorn, loopback only
    python -m envs.retrieval.server --index default                           # the embedded MiniLM index
    SEEDS_RETRIEVAL_TOKEN=... python -m envs.retrieval.server --index default --host 0.0.0.0   # other machines
    python -m envs.retrieval.server --engine ray --replicas 4 --index ...     # Ray Serve replicas (extra `ray`)

One FastAPI app (``envs/retrieval/server_app.py``), served by uvicorn on this node (requests
batched by an asyncio batcher, ``envs/retrieval/batching.py``) or by Ray Serve replicas across a
Ray cluster (``envs/retrieval/serve_ray.py``, ``@serve.batch``). Clients use
:class:`envs.retrieval.remote.RemoteRetriever` (``--retriever http://host:8000`` in
``inference.evaluate``, ``retriever: http://host:8000`` in the training configs). JSON only:

- ``POST /search``   ``{"queries": [...], "k": 5}`` ->
  ``{"results": [[{"id", "title", "text", "score", "rank", "row"}, ...] per query]}``
- ``POST /retrieve`` Search-R1's request and response
- ``POST /passages`` ``{"rows": [...]}`` -> ``{"passages": [{"row", "id", "title", "text"}, ...]}``
- ``GET /health``    size, encoder, index type, caps and served-request counters; ``/docs`` the API.

Security: with ``--token`` (or ``SEEDS_RETRIEVAL_TOKEN``) every endpoint wants
``Authorization: Bearer <token>``; binding an address other than loopback without a token is
refused unless ``--insecure``. Query length, queries and rows per request, ``k`` and body size are capped.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import threading
import time

import uvicorn

from envs.retrieval import serve_ray
from envs.retrieval.batching import AsyncBatcher
from envs.retrieval.defaults import open_retriever
from envs.retrieval.server_app import TOKEN_ENV, build_app
from envs.retrieval.server_models import ServerLimits

__all__ = ["RetrievalServer", "ServerLimits", "uvicorn_app", "main", "build_parser", "is_loopback"]


def uvicorn_app(retriever, limits: ServerLimits | None = None, token: str | None = None):
    """The FastAPI app for one node: searches batched by an :class:`AsyncBatcher` (``app.state.batcher``)."""
    limits = limits or ServerLimits()
    batcher = AsyncBatcher(retriever, limits.max_batch, limits.max_wait_ms)
    app = build_app(retriever, batcher.search, limits, token, engine="uvicorn",
                    batch_stats=batcher.stats.as_dict, on_shutdown=batcher.close)
    app.state.batcher = batcher
    return app


class RetrievalServer:
    """uvicorn serving :func:`uvicorn_app` on ``host:port``.

    ``port=0`` binds a free port (read it from ``server.port``). ``start()`` serves from a
    background thread (tests, benchmarks); ``serve_forever()`` from the caller's.
    """

    def __init__(self, retriever, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits | None = None,
                 token: str | None = None, verbose: bool = False):
        self.retriever, self.limits = retriever, limits or ServerLimits()
        self.app = uvicorn_app(retriever, self.limits, token)
        self.batcher: AsyncBatcher = self.app.state.batcher
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        config = uvicorn.Config(self.app, log_level="info" if verbose else "warning", access_log=verbose,
                                timeout_keep_alive=300, backlog=2048, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = self._socket.getsockname()[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def served(self) -> dict:
        """The counters ``/health`` reports."""
        return self.app.state.served()

    def serve_forever(self) -> None:
        self._server.run(sockets=[self._socket])

    def start(self) -> RetrievalServer:
        self._thread = threading.Thread(target=self.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the retrieval server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stop serving (from another thread than ``serve_forever``'s) and free the port."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
    parser.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"],
                        help="uvicorn: this node; ray: Ray Serve replicas on a Ray cluster (pip install '.[ray]')")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token", default=None,
                        help=f"bearer token every request must carry (default: ${TOKEN_ENV}, else none)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding a non-loopback address without a token (trusted networks only)")
    parser.add_argument("--max-batch", type=int, default=limits.max_batch,
                        help="queries per retriever call (1: one request at a time)")
    parser.add_argument("--max-wait-ms", type=float, default=limits.max_wait_ms,
                        help="how long a batch waits for more requests after its first")
    parser.add_argument("--max-queries-per-request", type=int, default=limits.max_queries_per_request)
    parser.add_argument("--max-query-chars", type=int, default=limits.max_query_chars)
    parser.add_argument("--max-k", type=int, default=limits.max_k)
    parser.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes)
    parser.add_argument("--max-rows-per-request", type=int, default=limits.max_rows_per_request)
    ray_group = parser.add_argument_group("Ray Serve (--engine ray)")
    ray_group.add_argument("--replicas", type=int, default=1, help="replicas, each with its own copy of the index")
    ray_group.add_argument("--num-cpus-per-replica", type=float, default=1.0)
    ray_group.add_argument("--num-gpus-per-replica", type=float, default=0.0,
                           help="GPUs per replica (1 on GPU machines: index and encoder on the replica's GPU)")
    ray_group.add_argument("--ray-address", default=None,
                           help="a running Ray cluster ('auto' on one of its nodes); default: start Ray here")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def resolve_token(host: str, token: str | None, insecure: bool) -> str | None:
    """The token to require (flag, else environment); refuses an open non-loopback server."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(host):
        if not insecure:
            raise SystemExit(f"error: binding {host} without a token would let anyone who reaches the port "
                             f"query this index: set --token or ${TOKEN_ENV}, or pass --insecure on a trusted "
                             "network")
        print(f"WARNING: binding {host} without a token (--insecure): anyone who can reach the port can "
              "query this index", file=sys.stderr)
    return token


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = ServerLimits(args.max_batch, args.max_wait_ms, args.max_queries_per_request, args.max_query_chars,
                              args.max_k, args.max_body_bytes, args.max_rows_per_request)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if str(args.index).startswith(("http://", "https://")):
        raise SystemExit("error: --index must be an index folder or 'default', not a URL")
    token = resolve_token(args.host, args.token, args.insecure)
    if args.engine == "ray":
        options = serve_ray.ReplicaOptions(args.replicas, args.num_cpus_per_replica, args.num_gpus_per_replica)
        return serve_ray.serve_forever(args.index, args.corpus, args.device, limits, token, options,
                                       args.host, args.port, args.ray_address)
    retriever = open_retriever(args.index, corpus=args.corpus, device=args.device)
    server = RetrievalServer(retriever, args.host, args.port, limits, token, verbose=args.verbose)
    print(f"serving {retriever!r} on {server.url} with uvicorn (max_batch={limits.max_batch}, "
          f"max_wait_ms={limits.max_wait_ms:g}, auth={'bearer' if token else 'none'}); API at {server.url}/docs; "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
