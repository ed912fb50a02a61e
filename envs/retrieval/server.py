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
- ``GET /health``    size, encoder, index type, caps and served-request counters;
  ``/openapi.json`` the API (``--docs`` adds the interactive ``/docs`` page, whose scripts come
  from a CDN).

Security: with ``SEEDS_RETRIEVAL_TOKEN`` (or ``--token-file``; ``--token`` shows it in ``ps``)
every endpoint wants ``Authorization: Bearer <token>``; binding an address other than loopback
without a token is refused unless ``--insecure``; ``--ssl-keyfile`` and ``--ssl-certfile`` serve
HTTPS. Request heads (size, header lines, time to send), bodies (size, time), connections, queries,
query length, ``k``, queries x ``k``, rows and response size are capped (:class:`ServerLimits`;
``docs/serving.md``).
"""
from __future__ import annotations

import argparse
import dataclasses
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
from envs.retrieval.server_protocol import quiet_repeated_warnings, uvicorn_options

__all__ = ["RetrievalServer", "ServerLimits", "uvicorn_app", "main", "build_parser", "is_loopback"]


def uvicorn_app(retriever, limits: ServerLimits | None = None, token: str | None = None, docs: bool = False):
    """The FastAPI app for one node: searches batched by an :class:`AsyncBatcher` (``app.state.batcher``)."""
    limits = limits or ServerLimits()
    batcher = AsyncBatcher(retriever, limits.max_batch, limits.max_wait_ms, limits.max_slice_chars)
    app = build_app(retriever, batcher.search, limits, token, engine="uvicorn",
                    batch_stats=batcher.stats.as_dict, on_shutdown=batcher.close, docs=docs)
    app.state.batcher = batcher
    return app


class RetrievalServer:
    """uvicorn serving :func:`uvicorn_app` on ``host:port``, over TLS when given a key and certificate.

    ``port=0`` binds a free port (read it from ``server.port``). ``start()`` serves from a
    background thread (tests, benchmarks); ``serve_forever()`` from the caller's. The connection
    and time caps of ``limits`` are enforced by :mod:`envs.retrieval.server_protocol`.
    """

    def __init__(self, retriever, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits | None = None,
                 token: str | None = None, verbose: bool = False, ssl_keyfile: str | None = None,
                 ssl_certfile: str | None = None, docs: bool = False):
        if bool(ssl_keyfile) != bool(ssl_certfile):
            raise ValueError("TLS needs both a key file and a certificate file")
        self.retriever, self.limits = retriever, limits or ServerLimits()
        self.scheme = "https" if ssl_certfile else "http"
        self.app = uvicorn_app(retriever, self.limits, token, docs)
        self.batcher: AsyncBatcher = self.app.state.batcher
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        config = uvicorn.Config(self.app, log_level="info" if verbose else "warning", access_log=verbose,
                                backlog=2048, lifespan="on", ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile,
                                **uvicorn_options(self.limits))
        self._server = uvicorn.Server(config)
        if not verbose:
            quiet_repeated_warnings()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = self._socket.getsockname()[0]
        return f"{self.scheme}://{'[' + host + ']' if ':' in host else host}:{self.port}"

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


LIMIT_HELP = {
    "max_batch": "queries per retriever call (1: one request at a time)",
    "max_wait_ms": "how long a batch waits for more requests after its first",
    "max_hits_per_request": "queries x k of one /search or /retrieve request",
    "max_response_bytes": "bytes of one response (a larger one is refused with 413)",
    "max_slice_chars": "query characters of one request per batch: larger requests take turns with others",
    "max_header_bytes": "bytes of a request's line and headers (more: 400, connection closed)",
    "max_headers": "header lines of one request (more: 431)",
    "max_connections": "open connections and requests in progress (beyond: 503)",
    "header_timeout_s": "seconds to send a whole request head (then 408, connection closed)",
    "body_timeout_s": "seconds to send a whole body after the head (then 408)",
    "keep_alive_s": "seconds an idle kept-alive connection stays open",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m envs.retrieval.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default="default",
                        help="index folder from scripts/build_index.py, or 'default' (the embedded MiniLM index)")
    parser.add_argument("--corpus", help="corpus file, when it moved since the index was built")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="index (and encoder) device")
    parser.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"],
                        help="uvicorn: this node; ray: Ray Serve replicas on a Ray cluster (pip install '.[ray]')")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-file", help=f"file holding the bearer token every request must carry (default: "
                                             f"${TOKEN_ENV}, else none)")
    parser.add_argument("--token", default=None, help="the token itself (visible to other users in `ps`: prefer "
                                                      f"${TOKEN_ENV} or --token-file)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding a non-loopback address without a token (trusted networks only)")
    parser.add_argument("--ssl-keyfile", help="serve HTTPS with this private key (PEM; with --ssl-certfile)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate chain (PEM; with --ssl-keyfile)")
    parser.add_argument("--docs", action="store_true", help="serve the interactive API page /docs (Swagger UI; the "
                                                            "browser loads its scripts from a CDN)")
    for field in dataclasses.fields(ServerLimits):
        default = getattr(ServerLimits, field.name)
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(default), default=default,
                            help=LIMIT_HELP.get(field.name, f"default {default}"))
    ray_group = parser.add_argument_group("Ray Serve (--engine ray)")
    ray_group.add_argument("--replicas", type=int, default=1, help="replicas, each with its own copy of the index")
    ray_group.add_argument("--num-cpus-per-replica", type=float, default=1.0)
    ray_group.add_argument("--num-gpus-per-replica", type=float, default=0.0,
                           help="GPUs per replica (1 on GPU machines: index and encoder on the replica's GPU)")
    ray_group.add_argument("--ray-address", default=None,
                           help="a running Ray cluster ('auto' on one of its nodes); default: start Ray here")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The token: ``--token-file`` (its content, stripped), else ``--token`` (with a warning), else
    ``$SEEDS_RETRIEVAL_TOKEN``, else none."""
    if token and token_file:
        raise SystemExit("error: give --token-file or --token, not both")
    if token_file:
        try:
            text = open(token_file, encoding="utf-8").read().strip()
        except OSError as err:
            raise SystemExit(f"error: --token-file {token_file}: {err.strerror}") from None
        if not text:
            raise SystemExit(f"error: --token-file {token_file} is empty")
        return text
    if token:
        print(f"WARNING: --token is visible to every user of this machine (ps); use ${TOKEN_ENV} or --token-file",
              file=sys.stderr)
        return token
    return os.environ.get(TOKEN_ENV) or None


def resolve_token(host: str, token: str | None, insecure: bool, token_file: str | None = None) -> str | None:
    """The token to require (file, flag, else environment); refuses an open non-loopback server."""
    token = read_token(token, token_file)
    if token is None and not is_loopback(host):
        if not insecure:
            raise SystemExit(f"error: binding {host} without a token would let anyone who reaches the port "
                             f"query this index: set ${TOKEN_ENV} or --token-file, or pass --insecure on a trusted "
                             "network")
        print(f"WARNING: binding {host} without a token (--insecure): anyone who can reach the port can "
              "query this index", file=sys.stderr)
    return token


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = ServerLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerLimits)})
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if str(args.index).startswith(("http://", "https://")):
        raise SystemExit("error: --index must be an index folder or 'default', not a URL")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise SystemExit("error: TLS needs both --ssl-keyfile and --ssl-certfile")
    token = resolve_token(args.host, args.token, args.insecure, args.token_file)
    if args.engine == "ray":
        if args.ssl_keyfile:
            raise SystemExit("error: --engine ray serves plain HTTP: put a TLS reverse proxy in front of it "
                             "(docs/serving.md)")
        options = serve_ray.ReplicaOptions(args.replicas, args.num_cpus_per_replica, args.num_gpus_per_replica)
        return serve_ray.serve_forever(args.index, args.corpus, args.device, limits, token, options,
                                       args.host, args.port, args.ray_address, verbose=args.verbose, docs=args.docs)
    retriever = open_retriever(args.index, corpus=args.corpus, device=args.device)
    server = RetrievalServer(retriever, args.host, args.port, limits, token, verbose=args.verbose,
                             ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, docs=args.docs)
    api = f"{server.url}/docs" if args.docs else f"{server.url}/openapi.json"
    print(f"serving {retriever!r} on {server.url} with uvicorn (max_batch={limits.max_batch}, "
          f"max_wait_ms={limits.max_wait_ms:g}, auth={'bearer' if token else 'none'}); API at {api}; "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
