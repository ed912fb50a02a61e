"""The HTTP side of live web search: search-API adapters, capped page fetches, a rate limiter, a disk cache.

Used by :mod:`envs.retrieval.web` (the ``web:`` retriever). Two search APIs are spoken:

- SearXNG: ``GET <base>/search?q=...&format=json`` (the instance must list ``json`` under
  ``search.formats`` in its ``settings.yml``); results ``{"results": [{"url", "title", "content"}]}``.
- Serper: ``POST https://google.serper.dev/search`` with ``{"q", "num"}`` and an ``X-API-KEY``
  header; results ``{"organic": [{"link", "title", "snippet"}]}``.

Pages are read as a stream and cut at ``max_bytes``; HTML becomes text with BeautifulSoup (scripts,
styles, navigation, headers, footers and forms dropped), ``text/plain`` is kept as it is, and any
other content type is recorded as an error instead of being parsed. A page client made by
:func:`page_client` refuses addresses that are not public (loopback, private, link-local, reserved),
redirects included: a result list written by someone else cannot make the agent read an internal service.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import httpx
from bs4 import BeautifulSoup

from envs.atomic import write_json_atomic

SERPER_URL = "https://google.serper.dev/search"
ENGINES = ("searxng", "serper")
HTML_TYPES = ("text/html", "application/xhtml+xml")
DROPPED_TAGS = ("script", "style", "noscript", "template", "svg", "iframe", "nav", "header", "footer",
                "aside", "form", "button", "select")
USER_AGENT = "seeds-rl/0.1 (research search agent; +https://pypi.org/project/seeds-rl/)"


class WebSearchError(RuntimeError):
    """The search API refused a request (bad key, JSON format disabled, bad endpoint); ``status`` is
    the HTTP status when there was one. Transient failures are not raised: see ``WebRetriever``."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class TransientError(RuntimeError):
    """A failure worth retrying: timeouts, refused connections, HTTP 429 and 5xx, bodies that are not JSON."""


@dataclass(frozen=True)
class SearchResult:
    """One search-engine result: the page address (fragment removed), its title and the engine's snippet."""

    url: str
    title: str
    snippet: str


@dataclass(frozen=True)
class Page:
    """A fetched page as text. ``error`` says why there is no text (HTTP status, content type, ...);
    ``truncated``: the body was longer than the byte cap and only its start was read."""

    url: str
    title: str = ""
    text: str = ""
    error: str | None = None
    truncated: bool = False

    def to_dict(self) -> dict:
        return {"url": self.url, "title": self.title, "text": self.text, "error": self.error,
                "truncated": self.truncated}


# -- search APIs -----------------------------------------------------------------------------------

def search_request(engine: str, url: str, query: str, n: int, language: str | None,
                   api_key: str | None) -> httpx.Request:
    """The HTTP request asking ``engine`` at ``url`` for ``n`` results for ``query``."""
    if engine == "searxng":
        params = {"q": query, "format": "json"}
        if language:
            params["language"] = language
        endpoint = url if urlsplit(url).path.rstrip("/").endswith("/search") else url.rstrip("/") + "/search"
        return httpx.Request("GET", endpoint, params=params, headers={"Accept": "application/json"})
    if engine == "serper":
        body: dict = {"q": query, "num": n}
        if language:
            body["hl"] = language
        return httpx.Request("POST", url, json=body, headers={"X-API-KEY": api_key or "",
                                                              "Accept": "application/json"})
    raise ValueError(f"unknown search engine {engine!r}; choose one of {', '.join(ENGINES)}")


def parse_results(engine: str, data: object) -> tuple[list[SearchResult], int]:
    """``(results, malformed)``: the engine's results in rank order, without repeated addresses, and
    the number of result entries skipped as malformed (no http(s) address, not an object)."""
    key, url_key, snippet_key = ("results", "url", "content") if engine == "searxng" else ("organic", "link", "snippet")
    if not isinstance(data, dict) or not isinstance(data.get(key, []), list):
        raise TransientError(f"the {engine} reply has no {key!r} list: {str(data)[:200]!r}")
    results, seen, malformed = [], set(), 0
    for item in data.get(key, []):
        url = item.get(url_key) if isinstance(item, dict) else None
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            malformed += 1
            continue
        url = urldefrag(url).url
        if url in seen:
            continue
        seen.add(url)
        results.append(SearchResult(url, _text(item.get("title")), _text(item.get(snippet_key))))
    return results, malformed


def _text(value: object) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


class Deadline(dict):
    """A total deadline for one request, its redirects included, however slowly the peer sends.

    It is httpx's per-request timeouts (``request.extensions["timeout"]``): each connect, read and
    write may wait ``timeout`` seconds but never past the deadline (httpcore asks before each body
    read). httpcore fixes the read timeout once for a whole response head, so :meth:`watch` also
    records every socket the request opens (httpcore's ``trace`` extension) and shuts them down when
    the deadline passes: a head sent a byte at a time fails then too. Clients using it keep no
    idle connections (:data:`NO_KEEPALIVE`), so every request opens, and so records, its socket.
    """

    def __init__(self, timeout: float, total: float):
        super().__init__(connect=timeout, read=timeout, write=timeout, pool=timeout)
        self.total, self.ends = float(total), time.monotonic() + float(total)
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.expired = False

    def get(self, key, default=None):
        value = super().get(key, default)
        left = max(self.ends - time.monotonic(), 0.001)
        return left if value is None else min(float(value), left)

    def passed(self) -> bool:
        return self.expired or time.monotonic() >= self.ends

    def watch(self, request: httpx.Request) -> Deadline:
        request.extensions["timeout"] = self
        request.extensions["trace"] = self._trace
        self._timer = threading.Timer(max(self.ends - time.monotonic(), 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _trace(self, event: str, info: dict) -> None:
        if event == "connection.connect_tcp.complete" and info.get("return_value") is not None:
            sock = info["return_value"].get_extra_info("socket")
            with self._lock:
                self._sockets.append(sock)
                expired = self.expired
            if expired:
                _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)  # each request its own connection (Deadline)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
    except OSError:
        pass


def send_json(client: httpx.Client, request: httpx.Request, max_bytes: int = 4_000_000,
              total: float | None = None) -> object:
    """Send ``request`` and decode its JSON reply (at most ``max_bytes``, within ``total`` seconds:
    default the client's timeout); TransientError or WebSearchError on failure."""
    per_op = client.timeout.read or 10.0
    deadline = Deadline(per_op, total or per_op).watch(request)
    try:
        response = client.send(request, stream=True)
        try:
            status = response.status_code
            body, over = _read_capped(response, max_bytes if status < 400 else 200, deadline)
        finally:
            response.close()
    except httpx.TransportError as err:  # refused, reset, DNS, timeouts
        late = f" (over the total deadline of {deadline.total:g} s)" if deadline.passed() else ""
        raise TransientError(f"{type(err).__name__}: {err}{late}") from None
    finally:
        deadline.cancel()
    if status == 429 or status >= 500:
        raise TransientError(f"HTTP {status} from {request.url.host}")
    if status >= 400:
        raise WebSearchError(f"the search API at {request.url.scheme}://{request.url.host} refused the request "
                             f"(HTTP {status}): {body.decode('utf-8', 'replace')!r}", status=status)
    if over:
        raise TransientError(f"the search API's reply is over {max_bytes} bytes (max_reply_bytes)")
    try:
        return json.loads(body)
    except ValueError:
        raise TransientError(f"the search API answered something that is not JSON: {body[:120]!r}") from None


def api_key_guard(endpoint: str) -> Callable[[httpx.Request], None]:
    """httpx request hook of the search client: drops ``X-API-KEY`` from any request to another
    origin than ``endpoint``'s (a redirect elsewhere; httpx drops ``Authorization`` itself)."""
    origin = httpx.URL(endpoint)

    def guard(request: httpx.Request) -> None:
        url = request.url
        if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port):
            request.headers.pop("X-API-KEY", None)

    return guard


# -- pages -----------------------------------------------------------------------------------------

class BlockedAddress(httpx.RequestError):
    """A page address that resolves to a loopback, private, link-local or otherwise non-public host."""


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: local-use translation, never public
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64, 6to4, IPv4-mapped or IPv4-compatible IPv6 address leads to."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL:
            return False
        inner = embedded_ipv4(address)
        return inner is None or _is_public(inner)
    return True


def non_public_address(host: str, port: int) -> str | None:
    """Why ``host`` may not be fetched, or None when every address it resolves to is public: the
    first address that is not (as text; an IPv6 address embedding a private IPv4 one, NAT64 or
    6to4, counts as private), or ``"does not resolve"``."""
    try:
        addresses = [ipaddress.ip_address(host.strip("[]").split("%")[0])]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as err:
            return f"does not resolve: {err}"
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        if not addresses:
            return "does not resolve"
    for address in addresses:
        if not _is_public(address):
            inner = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
            return f"{address}, embedding {inner}" if inner is not None else str(address)
    return None


def refuse_non_public(request: httpx.Request) -> None:
    """httpx request hook: raise :class:`BlockedAddress` for a host that is not public. Runs before
    every request of the client, each redirect included."""
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    address = non_public_address(request.url.host, port)
    if address is not None and address.startswith("does not resolve"):
        raise BlockedAddress(f"refused: {request.url.host} {address}", request=request)
    if address is not None:
        raise BlockedAddress(f"refused: {request.url.host} is a non-public address ({address}); "
                             "the web: option private_pages=true allows it", request=request)


def page_client(timeout: float, transport: httpx.BaseTransport | None = None,
                private_pages: bool = False) -> httpx.Client:
    """The client result pages are fetched with: redirects followed (5 at most), our user agent, and
    unless ``private_pages`` every request's host checked by :func:`refuse_non_public` (a name that
    does not resolve is refused too). ``timeout`` is also each fetch's total deadline (:func:`fetch_page`)."""
    hooks = {} if private_pages else {"request": [refuse_non_public]}
    return httpx.Client(timeout=timeout, follow_redirects=True, max_redirects=5, transport=transport,
                        headers={"User-Agent": USER_AGENT}, event_hooks=hooks, limits=NO_KEEPALIVE)


def fetch_page(client: httpx.Client, url: str, max_bytes: int, total: float | None = None) -> Page:
    """GET ``url`` and turn it into text, reading at most ``max_bytes`` of the body, all of it (the
    redirects, the head, the body) within ``total`` seconds (default: the client's timeout).

    Never raises for a bad page: HTTP errors, timeouts, unsupported content types come back as a
    :class:`Page` with ``error`` set (transient ones start with ``"transient: "``).
    """
    if urlsplit(url).scheme not in ("http", "https"):
        return Page(url, error=f"not an http(s) address: {url!r}")
    per_op = client.timeout.read or 10.0
    request = client.build_request("GET", url, headers={"User-Agent": USER_AGENT})
    deadline = Deadline(per_op, total or per_op).watch(request)
    try:
        response = client.send(request, stream=True)
        try:
            if response.status_code >= 400:
                transient = response.status_code == 429 or response.status_code >= 500
                return Page(url, error=("transient: " if transient else "") + f"HTTP {response.status_code}")
            kind = response.headers.get("content-type", "text/html").split(";")[0].strip().lower()
            if kind not in HTML_TYPES and kind != "text/plain":
                return Page(url, error=f"not an HTML or text page ({kind})")
            body, truncated = _read_capped(response, max_bytes, deadline)
            encoding = response.charset_encoding
        finally:
            response.close()
    except BlockedAddress as err:  # not transient: asking again gives the same answer
        return Page(url, error=str(err))
    except httpx.HTTPError as err:
        late = f" (over the total deadline of {deadline.total:g} s)" if deadline.passed() else ""
        return Page(url, error=f"transient: {type(err).__name__}: {err}{late}")
    finally:
        deadline.cancel()
    if kind == "text/plain":
        return Page(url, text=" ".join(body.decode(encoding or "utf-8", errors="replace").split()),
                    truncated=truncated)
    title, text = html_to_text(body, encoding)
    return Page(url, title=title, text=text, truncated=truncated)


def _read_capped(response: httpx.Response, max_bytes: int, deadline: Deadline | None = None) -> tuple[bytes, bool]:
    """The first ``max_bytes`` of the body, and whether there was more; ReadTimeout past ``deadline``."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return b"".join(chunks)[:max_bytes], True
        if deadline is not None and deadline.passed():
            raise httpx.ReadTimeout(f"the reply took longer than {deadline.total:g} s", request=response.request)
    return b"".join(chunks), False


def html_to_text(html: bytes | str, encoding: str | None = None) -> tuple[str, str]:
    """``(title, text)`` of an HTML document: visible text, one line per block, boilerplate tags dropped."""
    soup = BeautifulSoup(html, "html.parser", from_encoding=encoding if isinstance(html, bytes) else None)
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    for tag in soup.find_all(DROPPED_TAGS):
        tag.decompose()
    if soup.head:
        soup.head.decompose()
    lines = (" ".join(line.split()) for line in soup.get_text("\n").splitlines())
    return title, "\n".join(line for line in lines if line)


# -- rate limit and cache ----------------------------------------------------------------------------

class RateLimiter:
    """Token bucket: at most ``rate`` requests a second on average, bursts of up to ``burst``.

    ``acquire()`` reserves the next slot under a lock and then sleeps outside it, so threads queue in
    order without holding each other up; ``clock`` and ``sleep`` are injectable (tests use a fake
    clock). ``rate <= 0`` means no limit.
    """

    def __init__(self, rate: float, burst: int = 1, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.rate, self.burst = float(rate), int(burst)
        self.clock, self.sleep = clock, sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= 1.0
            wait = max(0.0, -self._tokens / self.rate)
        if wait > 0:
            self.sleep(wait)
        return wait


class WebCache:
    """JSON records on disk under ``root/<kind>/<2 hex>/<sha256>.json``, written atomically.

    A key is any JSON-serialisable value (it is hashed, and stored in the record to guard against
    collisions); an unreadable or mismatched record is a miss. ``root=None`` keeps nothing on disk.
    """

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root is not None else None

    def _path(self, kind: str, key: object) -> tuple[Path, str] | None:
        if self.root is None:
            return None
        text = json.dumps(key, sort_keys=True, ensure_ascii=False)
        digest = hashlib.sha256(text.encode()).hexdigest()
        return self.root / kind / digest[:2] / f"{digest}.json", text

    def get(self, kind: str, key: object) -> dict | None:
        found = self._path(kind, key)
        if found is None or not found[0].is_file():
            return None
        try:
            record = json.loads(found[0].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record.get("value") if isinstance(record, dict) and record.get("key") == found[1] else None

    def put(self, kind: str, key: object, value: dict) -> None:
        found = self._path(kind, key)
        if found is not None:
            write_json_atomic({"key": found[1], "value": value, "saved_at": time.time()}, found[0])
