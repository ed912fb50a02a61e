"""A loopback stand-in for the web: a SearXNG-style and a Serper-style search API and a few pages.

``FakeWeb`` runs an ``http.server`` on 127.0.0.1 (a free port) in a thread and records every
request as ``(method, path)``. Queries pick canned result lists (see ``results_for``); words in the
query trigger failures: ``boom`` (HTTP 500), ``notjson`` (an HTML body), ``denied`` (HTTP 403),
``slow`` (answers after ``SLOW_SECONDS``), ``malformed`` (bad result entries), ``empty`` (no results).
:meth:`FakeWeb.page_fetches` counts the HTTP requests for result pages (a test of what was fetched).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

SERPER_KEY = "test-serper-key-0123"
SLOW_SECONDS = 1.0
HUGE_BYTES = 3_000_000

FILLER = ("Tourists often visit the museums and the gardens in the spring. The weather is mild and the "
          "streets are busy with markets, cafes and street musicians who play until late at night. ")
PARIS = f"""<!doctype html><html><head><title>Paris - City Guide</title>
<script>var tracking = "capital of France script text";</script><style>body {{color: red}}</style></head>
<body><nav>Home | Cities | Login</nav><header>City Guide header</header>
<main><h1>Paris</h1><p>{FILLER * 4}</p>
<p>Paris is the capital and largest city of France, on the river Seine. The capital of France has
been Paris since the tenth century.</p><p>{FILLER * 4}</p></main>
<footer>Copyright footer text</footer></body></html>"""
ROME = """<html><head><title>Rome</title></head><body><p>Rome is the capital of Italy. It was founded,
according to legend, in 753 BC.</p></body></html>"""
PLAIN = "Berlin is the capital of Germany.\nIt lies on the river Spree."
EIFFEL = "The Eiffel Tower was completed in 1889 as the entrance arch to the World's Fair in Paris."
LONG = f"""<html><head><title>Eiffel Tower - Long Read</title></head><body><p>{FILLER * 30}</p>
<p>{EIFFEL}</p><p>{FILLER * 30}</p></body></html>"""  # the sentence sits ~5,400 characters in


def results_for(base: str, query: str) -> list[dict]:
    """Canned results: ``{"url", "title", "snippet"}`` in engine order (none for a query with ``empty``)."""
    if "empty" in query:
        return []
    if "seine" in query.lower():  # the Paris page again, under another snippet
        return [{"url": f"{base}/page/paris.html", "title": "Paris on the Seine", "snippet": "on the river Seine"}]
    if "eiffel" in query.lower():  # snippets that are in the long page: verbatim, shortened with "...", absent
        return [
            {"url": f"{base}/page/long.html", "title": "Eiffel Tower", "snippet": EIFFEL},
            {"url": f"{base}/page/long.html?elided", "title": "Eiffel (elided)",
             "snippet": "Tower was completed in 1889 ... the World's Fair in Paris"},
            {"url": f"{base}/page/long.html?nomatch", "title": "Eiffel (no match)", "snippet": "zeppelin hangar"},
        ]
    if "france" in query.lower():
        return [
            {"url": f"{base}/page/paris.html#history", "title": "Paris", "snippet": "Paris is the capital of France"},
            {"url": f"{base}/page/doc.pdf", "title": "A PDF", "snippet": "France statistics in a PDF"},
            {"url": f"{base}/page/missing", "title": "Gone", "snippet": "a page that no longer exists"},
            {"url": f"{base}/page/paris.html", "title": "Paris again", "snippet": "the same page twice"},
            {"url": f"{base}/page/huge.html", "title": "Huge", "snippet": "a very long page"},
            {"url": f"{base}/page/rome.html", "title": "Rome", "snippet": "Rome is the capital of Italy"},
            {"url": f"{base}/page/plain.txt", "title": "Berlin", "snippet": "Berlin facts"},
        ]
    return [{"url": f"{base}/page/rome.html", "title": "Rome", "snippet": "Rome is the capital of Italy"}]


class FakeWeb:
    def __init__(self):
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        handler = type("Handler", (_Handler,), {"web": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def paths(self, prefix: str = "") -> list[str]:
        return [path for _, path in self.requests if path.startswith(prefix)]

    def page_fetches(self) -> int:
        """HTTP requests made for result pages (everything under ``/page/``) since the last clear."""
        return len(self.paths("/page/"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    web: FakeWeb

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _json(self, data, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _search(self, query: str, serper: bool) -> None:
        if "slow" in query:
            time.sleep(SLOW_SECONDS)
        if "boom" in query:
            return self._send(500, b"internal error", "text/plain")
        if "denied" in query:
            return self._send(403, b"json format disabled", "text/plain")
        if "notjson" in query:
            return self._send(200, b"<html>rate limited</html>", "text/html")
        results = results_for(self.web.url, query)
        if serper:
            items = [{"title": r["title"], "link": r["url"], "snippet": r["snippet"], "position": i}
                     for i, r in enumerate(results, 1)]
            if "malformed" in query:
                items = ["not an object", {"title": "no link"}, {"link": "ftp://x/y", "title": "ftp"}, *items]
            return self._json({"searchParameters": {"q": query}, "organic": items})
        items = [{"url": r["url"], "title": r["title"], "content": r["snippet"], "engine": "fake"} for r in results]
        if "malformed" in query:
            items = ["not an object", {"title": "no url"}, {"url": "javascript:alert(1)"}, *items]
        return self._json({"query": query, "results": items})

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        self.web.requests.append(("GET", parts.path))
        self.web.headers.append(dict(self.headers))
        if parts.path == "/search":
            params = parse_qs(parts.query)
            if params.get("format") != ["json"]:
                return self._send(403, b"format not allowed", "text/plain")
            return self._search(params["q"][0], serper=False)
        pages = {"/page/paris.html": (PARIS.encode(), "text/html; charset=utf-8"),
                 "/page/rome.html": (ROME.encode(), "text/html"),
                 "/page/plain.txt": (PLAIN.encode(), "text/plain; charset=utf-8"),
                 "/page/long.html": (LONG.encode(), "text/html; charset=utf-8"),
                 "/page/doc.pdf": (b"%PDF-1.4 binary", "application/pdf")}
        if parts.path in pages:
            return self._send(200, *pages[parts.path])
        if parts.path == "/page/huge.html":
            return self._huge()
        return self._send(404, b"not found", "text/plain")

    def _huge(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(HUGE_BYTES))
        self.end_headers()
        chunk = b"<p>" + b"word " * 2000 + b"</p>"
        sent = 0
        try:
            while sent < HUGE_BYTES:
                piece = chunk[: HUGE_BYTES - sent]
                self.wfile.write(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at its cap

    def do_POST(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        self.web.requests.append(("POST", parts.path))
        self.web.headers.append(dict(self.headers))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.web.bodies.append(body)
        if parts.path != "/serper":
            return self._send(404, b"not found", "text/plain")
        if self.headers.get("X-API-KEY") != SERPER_KEY:
            return self._json({"message": "Unauthorized."}, status=401)
        return self._search(body.get("q", ""), serper=True)
