"""Live web search as a retriever: a search API, its results previewed by their snippets, pages read on admission.

    retriever = open_retriever("web:searxng:http://127.0.0.1:8888")     # a SearXNG instance
    retriever = open_retriever("web:serper?results=10&rps=2")           # Serper; key in $SERPER_API_KEY
    hits = retriever.search(["who wrote hamlet"], k=10)                 # list[list[Hit]], as Retriever.search

Spec: ``web:ENGINE[:URL][?option=value&...]`` with ENGINE ``searxng`` (URL required: the instance)
or ``serper`` (URL optional: another Serper-compatible endpoint). The options are the fields of
:class:`WebSearchConfig`.

One candidate per search result, in the engine's order (score ``1/engine rank``). How a candidate is
made is the ``previews`` option (docs/web_search.md):

- ``previews=snippet`` (the default; SEEDS's live-web setting): the candidate is the engine's title
  and snippet, and no page is fetched at search time (id ``<url>#page``). The env asks
  :meth:`WebRetriever.open_pages` for the text of the candidates it opens: only then is a page
  fetched, and the reader gets the ``reader_chars`` (3,000) characters of it around the snippet
  (:mod:`envs.retrieval.web_reader`). A page that cannot be read gives the snippet behind a note.
- ``previews=page`` (the behaviour before SEEDS's setting was followed): every top-k result page is
  fetched at search time, turned into text and split into ``passage_words``-word passages on sentence
  boundaries (the corpus convention, :func:`envs.retrieval.default_corpus.split_passages`); the
  candidate is the passage (or the ``passages_per_result`` passages) sharing most words with the query
  and the snippet (id ``<url>#<chunk>``); a page that cannot be used falls back to its snippet.
- ``fetch=false``: no page is ever fetched; the candidate and its opened text are the snippet
  (id ``<url>#snippet``).

A failed page (HTTP error, timeout, refused address, not HTML) is counted in ``stats`` and listed in
``errors``. ``row`` numbers the passages this retriever has given as candidates or by id, in
first-seen order, and ``corpus[row]`` / ``passages(ids)`` give them back (distractor injection draws
from them; a page passage never shown is read from the page cache by ``passages``). A page found by
several searches keeps one id and row, so an episode reads it once; each of its candidates shows its
own search's snippet (the corpus keeps the first one seen).

Search replies and pages are cached on disk (``cache_dir("web")`` unless ``cache`` says otherwise),
so a repeated query makes no HTTP call, in this run or a later one; the last pages read and every
opened window are also kept in memory, so re-opening a page in a run never fetches it again.
Transient search failures (timeouts, HTTP 429/5xx, replies that are not JSON) are retried ``retries``
times, then give an empty result (the env shows "No results.") recorded in ``stats.failed_searches``
and ``errors``; a refusal (bad key, HTTP 4xx) raises :class:`WebSearchError`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import httpx

from envs.paths import cache_dir
from envs.previews import query_terms
from envs.retrieval.default_corpus import split_passages
from envs.retrieval.web_config import PREVIEW_MODES, WebSearchConfig, WebStats, parse_web_spec
from envs.retrieval.web_http import (
    NO_KEEPALIVE,
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
from envs.retrieval.web_reader import OpenedPage, reader_window, unreadable_page_text
from envs.types import Hit, Passage

__all__ = ["PREVIEW_MODES", "OpenedPage", "WebCorpus", "WebRetriever", "WebSearchConfig", "WebSearchError",
           "WebStats", "open_web_retriever", "parse_web_spec"]
log = logging.getLogger(__name__)
SNIPPET_CHUNK = "snippet"  # id suffix of a candidate that is its snippet and nothing more
PAGE_CHUNK = "page"  # id suffix of a snippet-previewed candidate whose page is read when it is opened
MEMORY_PAGES = 64  # pages kept in memory (the disk cache keeps them all unless cache=off)
MEMORY_WINDOWS = 4096  # reader windows kept in memory (a few kB each)


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
    """In-memory state of one retriever: search results by (query, n), the pages that failed (by
    address) so a run does not ask again, the last :data:`MEMORY_PAGES` pages read (by address; all
    of them are in the disk cache too unless it is off) and the last :data:`MEMORY_WINDOWS` reader
    windows by (address, snippet), a failed page's note included."""

    results: dict = field(default_factory=dict)
    failed_pages: dict = field(default_factory=dict)
    pages: OrderedDict = field(default_factory=OrderedDict)
    opened: dict = field(default_factory=dict)


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
        """Top-``k`` candidates per query, in input order (fewer when the engine returns fewer); pages
        are fetched here only with ``previews=page``."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = list(queries)
        n = self.config.results or k
        distinct = list(dict.fromkeys(queries))
        with ThreadPoolExecutor(self.config.workers) as pool:
            found = dict(zip(distinct, pool.map(lambda q: self._results(q, n), distinct)))
            pages = {}
            if self._pages_at_search:
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

    # -- pages read on admission (previews=snippet) ----------------------------------------------

    def open_pages(self, hits: list[Hit]) -> list[OpenedPage | None]:
        """The reader's text of each candidate the env opens: for a snippet-previewed one (id
        ``<url>#page``) the ``reader_chars`` characters of its page around its snippet, the page
        fetched now unless this run already read it (distinct pages fetched in parallel); None for any
        other candidate (its text is already whole). A page that cannot be read gives the snippet
        behind a note, with ``error`` set: counted in ``stats.page_errors`` and listed in ``errors``."""
        self._read_ahead(hits)
        out: list[OpenedPage | None] = []
        for hit in hits:
            url = self._url_read_on_open(hit)
            out.append(None if url is None else self._open(url, [hit.text])[0])
            self._count(pages_opened=int(url is not None))
        return out

    def prefetch_pages(self, hits: list[Hit]) -> None:
        """Read now, in parallel (each distinct page once), what :meth:`open_pages` will give for
        ``hits``, so that its call finds it ready; nothing counts as opened. The env's step batcher
        calls it with every candidate its round's expand actions open, across questions."""
        self._read_ahead(hits)

    def _read_ahead(self, hits: list[Hit]) -> None:
        """:meth:`prefetch_pages` (also the first half of :meth:`open_pages`)."""
        snippets: dict[str, list[str]] = {}
        for hit in hits:
            url = self._url_read_on_open(hit)
            if url is not None and hit.text not in snippets.setdefault(url, []):
                snippets[url].append(hit.text)
        if len(snippets) == 1:
            self._open(*next(iter(snippets.items())))
        elif snippets:
            with ThreadPoolExecutor(min(self.config.workers, len(snippets))) as pool:
                list(pool.map(self._open, snippets, snippets.values()))

    def pages_fetched_by_search(self, query: str, k: int) -> int:
        """Pages ``search([query], k)`` read at search time: the distinct top-``k`` result pages with
        ``previews=page``, 0 otherwise (snippet previews read a page only when it is opened)."""
        if not self._pages_at_search:
            return 0
        with self._lock:
            results = self._scratch.results.get((query, self.config.results or k)) or []
        return len(dict.fromkeys(r.url for r in results[:k]))

    @property
    def _pages_at_search(self) -> bool:
        return self.config.fetch and self.config.previews == "page"

    def _url_read_on_open(self, hit: Hit) -> str | None:
        """The page address of a candidate whose page is read when it is opened, else None."""
        url, _, chunk = hit.id.rpartition("#")
        return url if self.config.fetch and chunk == PAGE_CHUNK and url else None

    def _open(self, url: str, snippets: list[str]) -> list[OpenedPage]:
        """The reader windows of the page at ``url`` around each snippet, the page read (once) only
        when one of them is not kept already (the last :data:`MEMORY_WINDOWS` are)."""
        with self._lock:
            found = [self._scratch.opened.get((url, snippet)) for snippet in snippets]
        kept = [opened for opened in found if opened is not None]
        if len(kept) == len(found):
            return kept
        page = self._page(url)
        out: list[OpenedPage] = []
        for snippet, opened in zip(snippets, found):
            if opened is None:
                if page.error is None:
                    opened = OpenedPage(reader_window(page.text, snippet, self.config.reader_chars))
                else:
                    opened = OpenedPage(unreadable_page_text(snippet, page.error), error=page.error)
            out.append(opened)
        with self._lock:
            for snippet, opened in zip(snippets, out):
                self._scratch.opened[(url, snippet)] = opened
            while len(self._scratch.opened) > MEMORY_WINDOWS:
                self._scratch.opened.pop(next(iter(self._scratch.opened)))
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
                f"previews={self.config.previews!r}, fetch={self.config.fetch}, passages={len(self.corpus)})")

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
        """The page at ``url`` as text: memory, the disk cache, else a fetch. A failure is remembered
        for this run (no second fetch) but not written to disk, so a later run asks again."""
        with self._lock:
            page = self._scratch.failed_pages.get(url)
            if page is None and url in self._scratch.pages:
                page = self._scratch.pages[url]
                self._scratch.pages.move_to_end(url)
                self.stats.page_cache_hits += 1
        if page is not None:
            return page
        key = {"url": url, "max_bytes": self.config.max_page_bytes}
        stored = self.cache.get("page", key)
        if stored is not None:
            page = Page(**stored)
            self._count(page_cache_hits=1)
            self._remember(page)
        else:
            self._count(waited_seconds=self._fetch_limiter.acquire(), pages_fetched=1)
            page = fetch_page(self._pages, url, self.config.max_page_bytes)
            if page.error is None:
                self.cache.put("page", key, page.to_dict())
                self._remember(page)
            else:
                self._count(page_errors=1)
                self._record({"url": url, "error": page.error})
                with self._lock:
                    self._scratch.failed_pages[url] = page
            self._count(pages_truncated=int(page.truncated))
        return page

    def _remember(self, page: Page) -> None:
        """Keep a read page in memory (the last :data:`MEMORY_PAGES`)."""
        with self._lock:
            self._scratch.pages[page.url] = page
            self._scratch.pages.move_to_end(page.url)
            while len(self._scratch.pages) > MEMORY_PAGES:
                self._scratch.pages.popitem(last=False)

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
        ``<title>``, else the engine's, else the address); the snippet when the page gave none or was
        not fetched (``<url>#page`` when it is read on opening, ``<url>#snippet`` when never)."""
        chunks = self._chunks(page)
        if chunks and page is not None:  # a page gives chunks only when it was read
            terms = query_terms(f"{query} {result.snippet}")
            overlap = [len(terms & query_terms(text)) for text in chunks]
            best = sorted(range(len(chunks)), key=lambda i: (-overlap[i], i))[: self.config.passages_per_result]
            title = page.title or result.title or result.url
            return [self.corpus.add(f"{result.url}#{i}", title, chunks[i]) for i in sorted(best)]
        if not (result.snippet or result.title):
            return []
        chunk = PAGE_CHUNK if self.config.fetch and not self._pages_at_search else SNIPPET_CHUNK
        title = result.title or result.url
        passage = self.corpus.add(f"{result.url}#{chunk}", title, result.snippet)
        # the page keeps its id and row (the first snippet seen stays in the corpus); the candidate
        # shows this search's title and snippet, and its page is read around this snippet
        return [replace(passage, title=title, text=result.snippet)]

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
