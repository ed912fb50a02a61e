"""The options of the ``web:`` retriever (:class:`WebSearchConfig`, parsed from a spec by
:func:`parse_web_spec`) and its counters (:class:`WebStats`). See :mod:`envs.retrieval.web`."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from urllib.parse import parse_qsl

import yaml

from envs.retrieval.default_corpus import MAX_WORDS
from envs.retrieval.web_http import ENGINES, SERPER_URL
from envs.retrieval.web_reader import DEFAULT_READER_CHARS
from envs.typed_config import from_dict

PREVIEW_MODES = ("snippet", "page")  # "snippet": SEEDS's live-web setting
_TEXT_OPTIONS = ("cache", "language", "api_key_env", "previews")  # taken as written, not as YAML ("off" stays "off")


@dataclass
class WebSearchConfig:
    """What a ``web:`` spec sets (docs/web_search.md).

    ``results``: results asked of the engine (None: the ``k`` of the search); ``previews``:
    ``snippet`` (SEEDS's live-web setting, the default: a candidate is the result's title and
    snippet, and its page is fetched only when the env opens it) or ``page`` (every top-k page
    fetched at search time, the candidate is its best passage); ``reader_chars``: characters of an
    opened page the reader gets, centred on the snippet (``snippet`` previews; SEEDS: ~3,000);
    ``fetch``: fetch result pages at all (False: snippet-only, nothing is ever fetched); ``cache``: a
    folder, ``"off"``, or None for ``cache_dir("web")``; ``rps`` / ``fetch_rps``: requests a second
    to the search API / to result pages (0: no limit); ``api_key_env``: the variable holding the
    Serper key; ``private_pages``: also fetch result pages whose host is not public (off: such a page
    is refused and its snippet stands in; the search API's own address is never checked)."""

    engine: str = "searxng"
    url: str | None = None
    results: int | None = None
    previews: str = "snippet"
    reader_chars: int = DEFAULT_READER_CHARS
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
        if self.previews not in PREVIEW_MODES:
            raise ValueError(f"web previews must be one of {', '.join(PREVIEW_MODES)}, got {self.previews!r}")
        if self.previews == "page" and not self.fetch:
            raise ValueError("previews=page reads every result page: it cannot be combined with fetch=false")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the search API address must start with http:// or https://, got {self.url!r}")
        positive = {"passage_words": self.passage_words, "passages_per_result": self.passages_per_result,
                    "max_page_bytes": self.max_page_bytes, "max_reply_bytes": self.max_reply_bytes,
                    "timeout": self.timeout, "workers": self.workers, "reader_chars": self.reader_chars}
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
    ``pages_opened`` (candidates whose page :meth:`WebRetriever.open_pages` read: fetched, cached or
    failed), ``pages_fetched`` (HTTP page fetches), ``page_cache_hits`` (pages read from memory or
    disk), ``page_errors`` (pages replaced by their snippet),
    ``pages_truncated`` (cut at ``max_page_bytes``), ``waited_seconds`` (rate-limit sleeps)."""

    searches: int = 0
    search_cache_hits: int = 0
    failed_searches: int = 0
    malformed_results: int = 0
    pages_opened: int = 0
    pages_fetched: int = 0
    page_cache_hits: int = 0
    page_errors: int = 0
    pages_truncated: int = 0
    waited_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)
