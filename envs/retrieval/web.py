"""Live web search as a retriever: a search API, result pages fetched and split into passages.

    retriever = open_retriever("web:searxng:http://127.0.0.1:8888")     # a SearXNG instance
    retriever = open_retriever("web:serper?results=10&rps=2")           # Serper; key in $SERPER_API_KEY
    hits = retriever.search(["who wrote hamlet"], k=10)                 # list[list[Hit]], as Retriever.search

Spec: ``web:ENGINE[:URL][?option=value&...]`` with ENGINE ``searxng`` (URL required: the instance)
or ``serper`` (URL optional: another Serper-compatible endpoint). The options are the fields of
:class:`WebSearchConfig`.

One candidate per search result, in the engine's order (score ``1/engine rank``). With ``fetch`` on,
the page is fetched, turned into text and split into ``passage_words``-word passages on sentence
boundaries (the corpus convention, :func:`envs.retrieval.default_corpus.split_passages`); the
candidate is the passage (or the ``passages_per_result`` passages) sharing most words with the query
and the engine's snippet. A page that cannot be used (HTTP error, timeout, not HTML) falls back to the
snippet, and the failure is counted in ``stats``. Passage ids are ``<url>#<chunk>`` (``<url>#snippet``
for snippets); ``row`` numbers the passages this retriever has given as candidates or by id, in
first-seen order, and ``corpus[row]`` / ``passages(ids)`` give them back (distractor injection
draws from them; a page passage never shown is read from the page cache by ``passages``).

Search replies and pages are cached on disk (``cache_dir("web")`` unless ``cache`` says otherwise),
so a repeated query makes no HTTP call, in this run or a later one. Transient search failures
(timeouts, HTTP 429/5xx, replies that are not JSON) are retried ``retries`` times, then give an empty
result (the env shows "No results.") recorded in ``stats.failed_searches`` and ``errors``; a refusal
(bad key, HTTP 4xx) raises :class:`WebSearchError`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from urllib.parse import parse_qsl

import httpx
import yaml

from envs.paths import cache_dir
from envs.previews import query_terms
from envs.retrieval.default_corpus import MAX_WORDS, split_passages
from envs.retrieval.web_http import (
    ENGINES,
    NO_KEEPALIVE,
    SERPER_URL,
    USER_AGENT,
    Page,
    RateLimiter,
    SearchResult,
    TransientError,
    WebCache,
    WebSearchError,
    api_key_guard,
    fetch_page,
    page_client,
    parse_results,
    search_request,
    send_json,
)
from envs.typed_config import from_dict
from envs.types import Hit, Passage

log = logging.getLogger(__name__)
SNIPPET_CHUNK = "snippet"
_TEXT_OPTIONS = ("cache", "language", "api_key_env")  # taken as written, not as YAML ("off" stays "off")


@dataclass
class WebSearchConfig:
    """What a ``web:`` spec sets. ``results``: results asked of the engine (None: the ``k`` of the
    search); ``fetch``: fetch result pages (False: snippet-only); ``cache``: a folder, ``"off"``, or
    None for ``cache_dir("web")``; ``rps`` / ``fetch_rps``: requests a second to the search API / to
    result pages (0: no limit); ``api_key_env``: the variable holding the Serper key;
    ``private_pages``: also fetch result pages whose host is not public (off: such a page is refused
    and its snippet stands in; the search API's own address is never checked)."""

    engine: str = "searxng"
    url: str | None = None
    results: int | None = None
    fetch: bool = True
    passage_words: int = MAX_WORDS
    passages_per_result: int = 1
    max_page_bytes: int = 2_000_000
    max_reply_bytes: int = 4_000_000  # a search API reply (larger: a failed search)
    timeout: float = 10.0  # seconds per connect/read and for a whole page fetch or search request
    rps: float = 1.0
    fetch_rps: float = 5.0
    workers: int = 8
    retries: int = 2
    backoff: float = 1.0
    language: str | None = None
    cache: str | None = None
    api_key_env: str = "SERPER_API_KEY"
    private_pages: bool = False  # fetch result pages on loopback / private / link-local addresses

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"unknown web search engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.engine == "searxng" and not self.url:
            raise ValueError("web:searxng needs the instance's address, e.g. web:searxng:http://127.0.0.1:8888")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the search API address must start with http:// or https://, got {self.url!r}")
        positive = {"passage_words": self.passage_words, "passages_per_result": self.passages_per_result,
                    "max_page_bytes": self.max_page_bytes, "max_reply_bytes": self.max_reply_bytes,
                    "timeout": self.timeout, "workers": self.workers}
        if self.results is not None:
            positive["results"] = self.results
        bad = [name for name, value in positive.items() if value <= 0]
        if bad or self.rps < 0 or self.fetch_rps < 0 or self.retries < 0 or self.backoff < 0:
            raise ValueError(f"web search options out of range: {bad or 'rps, fetch_rps, retries, backoff'} "
                             "(counts, sizes and the timeout must be positive; rates, retries, backoff >= 0)")

    @property
    def endpoint(self) -> str:
        return self.url or SERPER_URL


def parse_web_spec(spec: str) -> WebSearchConfig:
    """``"web:searxng:http://127.0.0.1:8888?results=10&fetch=false"`` -> :class:`WebSearchConfig`."""
    if not spec.startswith("web:"):
        raise ValueError(f"a web search spec starts with 'web:', got {spec!r}")
    body, _, query = spec[len("web:"):].partition("?")
    engine, _, url = body.partition(":")
    options = {key: value if key in _TEXT_OPTIONS else yaml.safe_load(value) if value else None
               for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))}
    for name in ("engine", "url"):
        if name in options:
            raise ValueError(f"{name} is given by the spec's form web:ENGINE[:URL], not as an option")
    return from_dict(WebSearchConfig, {"engine": engine, "url": url or None, **options})


@dataclass
class WebStats:
    """Counters since creation: ``searches`` (HTTP search calls), ``search_cache_hits`` (queries answered
    from memory or disk), ``failed_searches``, ``malformed_results`` (result entries skipped),
    ``pages_fetched``, ``page_cache_hits``, ``page_errors`` (pages replaced by their snippet),
    ``pages_truncated`` (cut at ``max_page_bytes``), ``waited_seconds`` (rate-limit sleeps)."""

    searches: int = 0
    search_cache_hits: int = 0
    failed_searches: int = 0
    malformed_results: int = 0
    pages_fetched: int = 0
    page_cache_hits: int = 0
    page_errors: int = 0
    pages_truncated: int = 0
    waited_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class WebCorpus:
    """The passages a :class:`WebRetriever` has handed out, by row (first-seen order) and by id."""

    def __init__(self, retriever: WebRetriever):
        self._retriever = retriever
        self._passages: list[Passage] = []
        self._rows: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, passage_id: str, title: str, text: str) -> Passage:
        """The passage with this id, registered with the next row if it is new."""
        with self._lock:
            row = self._rows.get(passage_id)
            if row is None:
                row = self._rows[passage_id] = len(self._passages)
                self._passages.append(Passage(row, passage_id, title, text))
            return self._passages[row]

    def __len__(self) -> int:
        return len(self._passages)

    def __getitem__(self, row: int) -> Passage:
        return self._passages[int(row)]

    def get_many(self, rows) -> list[Passage]:
        return [self[row] for row in rows]

    def row_of(self, passage_id: str) -> int:
        """Row of a passage id; a page passage not seen yet is read from the cache (or fetched)."""
        return self._retriever.passages([passage_id])[0].row

    def known(self, passage_id: str) -> Passage | None:
        with self._lock:
            row = self._rows.get(passage_id)
            return None if row is None else self._passages[row]

    def __repr__(self) -> str:
        return f"WebCorpus(passages={len(self)})"


@dataclass
class _Scratch:
    """In-memory state of one retriever: search results by (query, n), and the pages that failed (by
    address) so a run does not ask again. Page texts live in the disk cache, not in memory."""

    results: dict = field(default_factory=dict)
    failed_pages: dict = field(default_factory=dict)


class WebRetriever:
    """``search(queries, k) -> list[list[Hit]]`` over a web search API (see the module docstring)."""

    def __init__(self, config: WebSearchConfig, transport: httpx.BaseTransport | None = None,
                 search_limiter: RateLimiter | None = None, fetch_limiter: RateLimiter | None = None,
                 sleep=time.sleep):
        self.config = config
        self._api_key = os.environ.get(config.api_key_env) if config.engine == "serper" else None
        if config.engine == "serper" and not self._api_key:
            raise WebSearchError(f"web:serper needs an API key in the environment variable {config.api_key_env}")
        cache = config.cache
        self.cache = WebCache(None if cache == "off" else cache if cache is not None else cache_dir("web"))
        self._client = httpx.Client(timeout=config.timeout, follow_redirects=True, max_redirects=5,
                                    transport=transport, headers={"User-Agent": USER_AGENT},
                                    event_hooks={"request": [api_key_guard(config.endpoint)]},
                                    limits=NO_KEEPALIVE)  # the search API
        self._pages = page_client(config.timeout, transport, config.private_pages)
        self._search_limiter = search_limiter or RateLimiter(config.rps)
        self._fetch_limiter = fetch_limiter or RateLimiter(config.fetch_rps, burst=max(1, int(config.fetch_rps)))
        self._sleep = sleep
        self._scratch = _Scratch()
        self._lock = threading.Lock()
        self.stats = WebStats()
        self.errors: list[dict] = []  # {"query" or "url", "error"} for every recorded failure
        self.corpus = WebCorpus(self)

    # -- the Retriever interface -------------------------------------------------------------------

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` candidates per query, in input order (fewer when the engine returns fewer)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = list(queries)
        n = self.config.results or k
        distinct = list(dict.fromkeys(queries))
        with ThreadPoolExecutor(self.config.workers) as pool:
            found = dict(zip(distinct, pool.map(lambda q: self._results(q, n), distinct)))
            pages = {}
            if self.config.fetch:
                urls = list(dict.fromkeys(r.url for q in distinct for r in found[q][:k]))
                pages = dict(zip(urls, pool.map(self._page, urls)))
        hits = {q: self._hits(q, found[q], k, pages) for q in distinct}
        return [list(hits[q]) for q in queries]

    def passages(self, ids: list[str]) -> list[Passage]:
        """Passages by id (``<url>#<chunk>`` or one seen as a snippet); KeyError for an unknown id."""
        out = []
        for passage_id in ids:
            passage = self.corpus.known(passage_id)
            if passage is None:
                url, _, chunk = passage_id.rpartition("#")
                if url and chunk.isdigit() and self.config.fetch:
                    page = self._page(url)
                    chunks = self._chunks(page)
                    if int(chunk) < len(chunks):
                        passage = self.corpus.add(passage_id, page.title or url, chunks[int(chunk)])
            if passage is None:
                raise KeyError(f"web passage {passage_id!r} was not seen by this retriever and is not a "
                               "page passage id (<url>#<chunk>) whose page can be read")
            out.append(passage)
        return out

    def close(self) -> None:
        self._client.close()
        self._pages.close()

    def __enter__(self) -> WebRetriever:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:  # never the key
        return (f"WebRetriever(engine={self.config.engine!r}, url={self.config.endpoint!r}, "
                f"fetch={self.config.fetch}, passages={len(self.corpus)})")

    # -- search results ----------------------------------------------------------------------------

    def _results(self, query: str, n: int) -> list[SearchResult]:
        """The engine's results for ``query``: memory, then disk, then the API (with retries)."""
        cfg = self.config
        key = {"engine": cfg.engine, "endpoint": cfg.endpoint, "query": query, "n": n, "language": cfg.language}
        with self._lock:
            cached = self._scratch.results.get((query, n))
        stored = cached if cached is not None else self.cache.get("search", key)
        if stored is not None:
            self._count(search_cache_hits=1)
            results = [SearchResult(**r) for r in stored["results"]] if cached is None else cached
        else:
            results = self._search_api(query, n)
            if results is None:
                return []
            if results:  # an empty reply may be an engine hiccup: a later run asks again
                self.cache.put("search", key, {"results": [asdict(r) for r in results]})
        with self._lock:
            self._scratch.results[(query, n)] = results
        return results[:n]

    def _search_api(self, query: str, n: int) -> list[SearchResult] | None:
        """One search through the API, retried on transient failures; None when they persist."""
        cfg = self.config
        last = "no attempt made"
        for attempt in range(cfg.retries + 1):
            if attempt:
                self._sleep(cfg.backoff * 2 ** (attempt - 1))
            self._count(waited_seconds=self._search_limiter.acquire(), searches=1)
            request = search_request(cfg.engine, cfg.endpoint, query, n, cfg.language, self._api_key)
            try:
                reply = send_json(self._client, request, cfg.max_reply_bytes, cfg.timeout)
                results, malformed = parse_results(cfg.engine, reply)
            except TransientError as err:
                last = str(err)
                continue
            self._count(malformed_results=malformed)
            return results
        self._count(failed_searches=1)
        self._record({"query": query, "error": last})
        return None

    # -- pages -------------------------------------------------------------------------------------

    def _page(self, url: str) -> Page:
        """The page at ``url`` as text: the disk cache, else a fetch. A failure is remembered for this
        run (no second fetch) but not written to disk, so a later run asks again."""
        with self._lock:
            page = self._scratch.failed_pages.get(url)
        if page is not None:
            return page
        key = {"url": url, "max_bytes": self.config.max_page_bytes}
        stored = self.cache.get("page", key)
        if stored is not None:
            page = Page(**stored)
            self._count(page_cache_hits=1)
        else:
            self._count(waited_seconds=self._fetch_limiter.acquire(), pages_fetched=1)
            page = fetch_page(self._pages, url, self.config.max_page_bytes)
            if page.error is None:
                self.cache.put("page", key, page.to_dict())
            else:
                self._count(page_errors=1)
                self._record({"url": url, "error": page.error})
                with self._lock:
                    self._scratch.failed_pages[url] = page
            self._count(pages_truncated=int(page.truncated))
        return page

    def _chunks(self, page: Page | None) -> list[str]:
        """A page's passages: ``passage_words``-word pieces on sentence boundaries (chunk i = id ``#i``)."""
        if page is None or page.error is not None:
            return []
        return split_passages(page.text, self.config.passage_words)

    # -- hits --------------------------------------------------------------------------------------

    def _hits(self, query: str, results: list[SearchResult], k: int, pages: dict[str, Page]) -> list[Hit]:
        """Up to ``k`` candidates: the best passages of each result's page, else its snippet."""
        hits: list[Hit] = []
        for engine_rank, result in enumerate(results, 1):
            chosen = self._chosen_passages(query, result, pages.get(result.url))
            for passage in chosen:
                if len(hits) == k:
                    return hits
                hits.append(Hit.from_passage(passage, 1.0 / engine_rank, len(hits) + 1))
        return hits

    def _chosen_passages(self, query: str, result: SearchResult, page: Page | None) -> list[Passage]:
        """The ``passages_per_result`` passages of the result's page sharing most words with the
        query and the snippet (page order among equals), registered in the corpus (title: the page's
        ``<title>``, else the engine's, else the address); the snippet when the page gave none."""
        chunks = self._chunks(page)
        if chunks:
            terms = query_terms(f"{query} {result.snippet}")
            overlap = [len(terms & query_terms(text)) for text in chunks]
            best = sorted(range(len(chunks)), key=lambda i: (-overlap[i], i))[: self.config.passages_per_result]
            title = page.title or result.title or result.url
            return [self.corpus.add(f"{result.url}#{i}", title, chunks[i]) for i in sorted(best)]
        if not (result.snippet or result.title):
            return []
        return [self.corpus.add(f"{result.url}#{SNIPPET_CHUNK}", result.title or result.url, result.snippet)]

    def _count(self, **increments) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    def _record(self, failure: dict) -> None:
        log.warning("web search: %s", failure)
        with self._lock:
            self.errors.append(failure)


def open_web_retriever(spec: str, **kwargs) -> WebRetriever:
    """:class:`WebRetriever` from a ``web:`` spec (``kwargs`` go to the constructor)."""
    return WebRetriever(parse_web_spec(spec), **kwargs)
