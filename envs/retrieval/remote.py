"""Client of the retrieval server (``envs/retrieval/server.py``): a drop-in for the local Retriever.

    from envs.retrieval.remote import RemoteRetriever
    retriever = RemoteRetriever("http://10.0.0.5:8000")   # python -m envs.retrieval.server running there
    hits = retriever.search(["who wrote hamlet"], k=5)      # list[list[Hit]], as Retriever.search
    env = SearchEnv(retriever, dataset)                     # .corpus serves distractor injection

Or from a spec string: ``envs.retrieval.defaults.open_retriever("http://10.0.0.5:8000")``.

Retries with exponential back-off (``backoff * 2**attempt`` seconds) on connection errors,
timeouts and 5xx answers only; a 4xx answer raises :class:`RemoteRetrievalError` at once with
the server's reason. A ``threading.BoundedSemaphore`` caps requests in flight from this client;
a batch larger than the server's per-request caps (queries, queries x k) is sent as several
requests. An ``https://`` server is verified against the system's CAs, or ``$SEEDS_RETRIEVAL_CA``. Proxy settings of
the environment are ignored (``trust_env=False``): the server is on the local network.
A server started with a token (``--token`` or ``SEEDS_RETRIEVAL_TOKEN``) wants it on every
request: pass ``token=``, or set ``SEEDS_RETRIEVAL_TOKEN`` where the client runs (PPO, evaluation
and ``open_retriever("http://...")`` read it), and it goes in ``Authorization: Bearer``.
"""
from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from envs.types import Hit, Passage

TOKEN_ENV = "SEEDS_RETRIEVAL_TOKEN"  # the same variable the server reads
CA_ENV = "SEEDS_RETRIEVAL_CA"  # a CA bundle (PEM) that signed an https server's certificate (a self-signed one)


class RemoteRetrievalError(RuntimeError):
    """The server refused a request (``status`` 4xx), or did not answer after the retries."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteRetriever:
    """``search(queries, k) -> list[list[Hit]]`` answered by a retrieval server at ``url``.

    ``token``: the server's bearer token (default: ``$SEEDS_RETRIEVAL_TOKEN``, else none).
    ``ca_file``: for an ``https://`` server whose certificate the system does not trust (a
    self-signed one), the PEM bundle that signed it (default: ``$SEEDS_RETRIEVAL_CA``).
    """

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 max_concurrency: int = 8, token: str | None = None, ca_file: str | None = None):
        if not str(url).startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if retries < 0 or backoff < 0 or max_concurrency < 1:
            raise ValueError("retries and backoff must be >= 0 and max_concurrency >= 1")
        self.url = str(url).rstrip("/")
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        token = token or os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ca_file = ca_file or os.environ.get(CA_ENV) or None
        verify = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._client = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, headers=headers, verify=verify,
                                    limits=httpx.Limits(max_connections=max_concurrency,
                                                        max_keepalive_connections=max_concurrency))
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._info: dict | None = None  # /health, fetched once: size and caps
        self.corpus = RemoteCorpus(self)

    # -- the Retriever interface -----------------------------------------------------------------

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query, in input order: the local Retriever's output for this index."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = list(queries)
        if not queries:
            return []
        info = self.info()
        step = int(info["max_queries_per_request"])
        if info.get("max_hits_per_request"):  # servers since the cap: queries x k per request
            step = max(1, min(step, int(info["max_hits_per_request"]) // k))
        results: list[list[Hit]] = []
        for start in range(0, len(queries), step):
            chunk = queries[start : start + step]
            data = self._request("POST", "/search", {"queries": chunk, "k": k})
            found = data.get("results")
            if not isinstance(found, list) or len(found) != len(chunk):
                raise RemoteRetrievalError(f"{self.url}/search answered {len(found or [])} result lists "
                                           f"for {len(chunk)} queries")
            results.extend([_hit(h) for h in hits] for hits in found)
        return results

    def health(self) -> dict:
        """The server's ``/health``: passages, encoder, index type, dim, limits and counters."""
        info = self._request("GET", "/health")
        self._info = info
        return info

    def info(self) -> dict:
        """``/health`` as first fetched (size and caps do not change while a server runs)."""
        return self._info if self._info is not None else self.health()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteRetriever({self.url!r})"

    # -- HTTP with retries -------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: dict | None = None) -> Any:
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                with self._slots:
                    response = self._client.request(method, path, json=payload)
            except httpx.TransportError as err:  # refused, reset, DNS, timeouts
                last = f"{type(err).__name__}: {err}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_reason(response)}"
                continue
            if response.status_code >= 400:
                raise RemoteRetrievalError(f"{self.url}{path} refused the request (HTTP {response.status_code}): "
                                           f"{_reason(response)}", status=response.status_code)
            try:
                return response.json()
            except ValueError:
                raise RemoteRetrievalError(f"{self.url}{path} answered something that is not JSON: "
                                           f"{response.text[:200]!r}", status=response.status_code) from None
        raise RemoteRetrievalError(f"retrieval server {self.url} failed {method} {path} after "
                                   f"{self.retries + 1} attempt(s); last error: {last}")


class RemoteCorpus:
    """The server's corpus: ``len()`` from ``/health``, passages by row from ``/passages``."""

    def __init__(self, remote: RemoteRetriever):
        self._remote = remote

    def __len__(self) -> int:
        return int(self._remote.info()["passages"])

    def __getitem__(self, row: int) -> Passage:
        return self.get_many([row])[0]

    def get_many(self, rows: Sequence[int]) -> list[Passage]:
        """Passages for ``rows`` in the order given (negative rows count from the end, as in Corpus)."""
        n = len(self)
        wanted = []
        for row in rows:
            row = int(row)
            if not -n <= row < n:
                raise IndexError(f"row {row} out of range for a corpus of {n} passages")
            wanted.append(row % n)
        step = int(self._remote.info().get("max_rows_per_request", 1024))
        passages: list[Passage] = []
        for start in range(0, len(wanted), step):
            data = self._remote._request("POST", "/passages", {"rows": wanted[start : start + step]})
            passages.extend(Passage(int(p["row"]), p["id"], p["title"], p["text"]) for p in data["passages"])
        return passages

    def __repr__(self) -> str:
        return f"RemoteCorpus({self._remote.url!r})"


def _hit(item: dict) -> Hit:
    return Hit(int(item["row"]), item["id"], item["title"], item["text"], float(item["score"]), int(item["rank"]))


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase
