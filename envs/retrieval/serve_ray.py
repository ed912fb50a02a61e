"""The retrieval server on Ray Serve: replicas of the same app, each with its own copy of the index.

    python -m envs.retrieval.server --engine ray --replicas 4 --index indexes/wiki18-e5      # CLI
    serve run configs/serve/retrieval.yaml                                                  # Serve config

Ray is the optional extra ``ray`` (``pip install -e '.[ray]'``); it is imported only here, inside
functions, so nothing else needs it. Each replica (:class:`RetrievalReplica`) opens the index,
builds the FastAPI app of ``envs/retrieval/server_app.py`` over it (``serve.ingress``, the same
endpoints and shapes as the uvicorn engine) and batches the searches of concurrent requests with
``@serve.batch`` (``max_batch`` queries per batch, ``max_wait_ms`` of waiting), answered by
``envs.retrieval.batching.search_requests``. Ray Serve's proxy spreads requests over the replicas
and serves them at one address (``http_options``; on a cluster, a proxy on every node).
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from envs.retrieval.batching import BatchStats, search_requests
from envs.retrieval.defaults import default_retriever, open_retriever
from envs.retrieval.retriever import Retriever
from envs.retrieval.server_app import TOKEN_ENV, build_app
from envs.retrieval.server_models import ServerLimits
from envs.types import Hit

APP_NAME = "retrieval"


@dataclass
class ReplicaOptions:
    """How many replicas and what each one holds of the cluster."""

    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0  # 1 on GPU machines: the replica's index and encoder on its own GPU
    max_ongoing_requests: int = 512  # requests a replica holds at once (Ray's default of 5 starves batching)

    def __post_init__(self):
        if self.replicas < 1 or self.num_cpus < 0 or self.num_gpus < 0 or self.max_ongoing_requests < 1:
            raise ValueError("replicas and max_ongoing_requests must be >= 1, num_cpus and num_gpus >= 0")


def open_index(index: str, corpus: str | None, device: str, cache_size: int | None = None):
    """The replica's retriever: ``open_retriever``'s specs; ``cache_size`` (None: the default) sets
    the result cache (0: off, as the benchmark wants)."""
    if cache_size is None:
        return open_retriever(index, corpus=corpus, device=device)
    if index == "default":
        return default_retriever(device=device, cache_size=cache_size, show_progress=False)
    return Retriever.from_dir(index, corpus=corpus, device=device, cache_size=cache_size)


def _queries_in(items: list[tuple[list[str], int]]) -> int:
    return sum(len(queries) for queries, _ in items)


class RetrievalReplica:
    """One Ray Serve replica. Wrapped by ``serve.ingress()`` and ``serve.deployment`` in
    :func:`replica_deployment`; ``__serve_build_asgi_app__`` hands Serve the app once ``__init__`` ran."""

    def __init__(self, index: str, corpus: str | None, device: str, limits: dict, token: str | None,
                 cache_size: int | None = None, docs: bool = False):
        from ray import serve

        self.limits, self.token, self.docs = ServerLimits(**limits), token, docs
        self.retriever = open_index(index, corpus, device, cache_size)
        self.stats = BatchStats()
        self._batched = serve.batch(max_batch_size=self.limits.max_batch,
                                    batch_wait_timeout_s=self.limits.max_wait_ms / 1000,
                                    batch_size_fn=_queries_in)(self._search_batch)

    async def _search_batch(self, requests: list[tuple[list[str], int]]) -> list:
        """``@serve.batch``'s function: the waiting requests, one retriever call per distinct ``k``."""
        return await asyncio.to_thread(search_requests, self.retriever, list(requests), self.stats)

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        answer = await self._batched((list(queries), int(k)))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def __serve_build_asgi_app__(self):
        return build_app(self.retriever, self.search, self.limits, self.token, engine="ray",
                         batch_stats=self.stats.as_dict, docs=self.docs)


def replica_deployment(options: ReplicaOptions):
    """The Serve deployment of :class:`RetrievalReplica` with ``options``."""
    from ray import serve

    ingress = serve.ingress()(RetrievalReplica)
    return serve.deployment(ingress, name="RetrievalReplica", num_replicas=options.replicas,
                            max_ongoing_requests=options.max_ongoing_requests,
                            ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus})


def application(index: str, corpus: str | None, device: str, limits: ServerLimits, token: str | None,
                options: ReplicaOptions, cache_size: int | None = None, docs: bool = False):
    """The Serve application (bound deployment) to ``serve.run``."""
    return replica_deployment(options).bind(index, corpus, device, asdict(limits), token, cache_size, docs)


def app_builder(args: dict[str, Any]):
    """``import_path`` of the Serve config (``configs/serve/retrieval.yaml``): its ``args`` are the
    index spec (``index``, ``corpus``, ``device``), ``ServerLimits`` fields, ``ReplicaOptions``
    fields and ``cache_size``. The token comes from ``$SEEDS_RETRIEVAL_TOKEN`` where ``serve run`` runs."""
    args = dict(args)
    spec = {name: args.pop(name, default) for name, default in
            (("index", "default"), ("corpus", None), ("device", "auto"), ("cache_size", None))}
    limit_names, option_names = set(ServerLimits.__dataclass_fields__), set(ReplicaOptions.__dataclass_fields__)
    unknown = set(args) - limit_names - option_names
    if unknown:
        raise ValueError(f"unknown args {sorted(unknown)} for the retrieval app; known: index, corpus, device, "
                         f"cache_size, {', '.join(sorted(limit_names | option_names))}")
    limits = ServerLimits(**{k: v for k, v in args.items() if k in limit_names})
    options = ReplicaOptions(**{k: v for k, v in args.items() if k in option_names})
    return application(spec["index"], spec["corpus"], spec["device"], limits, os.environ.get(TOKEN_ENV) or None,
                       options, spec["cache_size"])


def logging_config(verbose: bool = False) -> dict:
    """Serve's logging: warnings only and no per-request access log, unless ``verbose``."""
    return {"log_level": "INFO", "enable_access_log": True} if verbose else \
        {"log_level": "WARNING", "enable_access_log": False}


def run(app, host: str = "127.0.0.1", port: int = 8000, verbose: bool = False) -> str:
    """Start Serve's proxy on ``host:port`` (Ray already initialised) and deploy ``app`` at ``/``;
    returns once the replicas are up. The URL clients use. Quiet unless ``verbose``
    (:func:`logging_config`: Serve logs every request at INFO otherwise)."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port}, logging_config=logging_config(verbose))
    serve.run(app, name=APP_NAME, route_prefix="/", logging_config=logging_config(verbose))
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def serve_forever(index: str, corpus: str | None, device: str, limits: ServerLimits, token: str | None,
                  options: ReplicaOptions, host: str, port: int, ray_address: str | None, verbose: bool = False,
                  docs: bool = False) -> int:
    """``python -m envs.retrieval.server --engine ray``: deploy, then serve until Ctrl-C."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SystemExit("error: --engine ray needs Ray Serve: pip install -e '.[ray]'") from None
    ray.init(address=ray_address)  # None: a local Ray on this machine; "auto": the cluster this node is in
    try:
        url = run(application(index, corpus, device, limits, token, options, docs=docs), host, port, verbose)
        print(f"serving {index} on {url} with Ray Serve ({options.replicas} replica(s), "
              f"{options.num_gpus:g} GPU each, max_batch={limits.max_batch}, auth={'bearer' if token else 'none'}); "
              f"API at {url}/{'docs' if docs else 'openapi.json'}; Ctrl-C stops", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        serve.shutdown()
        ray.shutdown()
