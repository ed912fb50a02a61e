"""The retrieval server's HTTP API as one FastAPI app, whichever engine serves it.

:func:`build_app` takes a retriever (for its corpus and description) and an async ``search``
(the batcher that answers ``(queries, k)``): uvicorn serves it with :class:`AsyncBatcher`
(``envs/retrieval/server.py``), each Ray Serve replica with ``@serve.batch``
(``envs/retrieval/serve_ray.py``). Bodies are validated by the pydantic models of
``envs/retrieval/server_models.py``; every refusal is ``{"error": reason}`` with a 4xx. The header
count, an optional bearer token, the body-size cap and the body's deadline are checked first, by
:class:`Guard`, before a body is parsed; the work of a request (queries x k) and its response's
size are capped too.
"""
import asyncio
import hmac
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from envs.retrieval.remote import TOKEN_ENV
from envs.retrieval.server_models import (
    ROUTES,
    SEARCH_R1_DEFAULT_TOPK,
    ErrorResponse,
    PassagesResponse,
    RequestError,
    RetrieveResponse,
    SearchResponse,
    ServerLimits,
    check_rows,
    describe_validation_error,
    hit_json,
    passage_json,
    request_models,
    search_r1_result,
)
from envs.types import Hit

DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")  # the API's description: no token
Search = Callable[[list[str], int], Awaitable[list[list[Hit]]]]
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 408, 413, 431, 500)}


class Counters:
    """Served-request counters for ``/health`` (touched from the event loop only)."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


async def _reply(send, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
    body = JSONResponse({"error": reason}).body
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")] + [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware run before FastAPI: the header count, the bearer token (every path but the
    API description), the body-size cap (by ``Content-Length``, and by counting a chunked body as
    it arrives) and the body's deadline (``body_timeout_s`` for the whole body, however slowly it
    trickles in). Every body is read as JSON, whatever its ``Content-Type`` says."""

    def __init__(self, app, token: str | None, limits: ServerLimits, counts: Counters):
        self.app, self.token, self.limits, self.counts = app, token, limits, counts
        self.max_body_bytes = limits.max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if len(scope["headers"]) > self.limits.max_headers:
            self.counts.add("errors_4xx")
            return await _reply(send, 431, f"{len(scope['headers'])} header lines are over the server's cap "
                                           f"max_headers={self.limits.max_headers}")
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] not in DOC_PATHS:
            problem = token_problem(headers.get(b"authorization", b"").decode("latin-1"), self.token)
            if problem:
                self.counts.add("errors_4xx")
                return await _reply(send, 401, problem, {"www-authenticate": "Bearer"})
        cap = self.max_body_bytes
        declared = headers.get(b"content-length", b"0").decode("latin-1")
        if declared.isdigit() and int(declared) > cap:
            self.counts.add("errors_4xx")
            return await _reply(send, 413, f"body of {declared} bytes is over the server's cap "
                                           f"max_body_bytes={cap}")
        timeout = self.limits.body_timeout_s
        try:
            body = await asyncio.wait_for(self._read_body(receive, cap), timeout)
        except asyncio.TimeoutError:
            self.counts.add("errors_4xx")
            return await _reply(send, 408, f"the body took longer than the server's body_timeout_s={timeout:g}")
        if body is None:  # the client went away
            return None
        if len(body) > cap:
            self.counts.add("errors_4xx")
            return await _reply(send, 413, f"body of more than {cap} bytes is over the server's cap "
                                           f"max_body_bytes={cap}")
        replayed = [{"type": "http.request", "body": body, "more_body": False}]
        if not headers.get(b"content-type", b"").startswith(b"application/json"):  # JSON only, as sent by curl -d
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                     + [(b"content-type", b"application/json")]}

        async def replay():
            return replayed.pop() if replayed else await receive()

        return await self.app(scope, replay, send)


    @staticmethod
    async def _read_body(receive, cap: int) -> bytes | None:
        """The whole body; None if the client disconnected; stops reading once past ``cap``."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > cap:
                break
            more = message.get("more_body", False)
        return b"".join(chunks)


def token_problem(authorization: str, token: str) -> str | None:
    """Why ``authorization`` (the header's value) does not carry ``token``; None when it does."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return (f"this server needs a bearer token: send 'Authorization: Bearer <token>' "
                f"(RemoteRetriever: token= or the {TOKEN_ENV} environment variable)")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None


def check_hits(n_queries: int, k: int, limits: ServerLimits) -> None:
    """The work of one search request, queries x k, within ``max_hits_per_request`` (else 413)."""
    if n_queries * k > limits.max_hits_per_request:
        raise RequestError(413, f"{n_queries} queries x k={k} = {n_queries * k} hits is over the server's cap "
                                f"max_hits_per_request={limits.max_hits_per_request} (split the request)")


def capped_json(content: dict, max_bytes: int) -> JSONResponse:
    """``content`` as a JSON response, or a 413 when it is over ``max_bytes``."""
    response = JSONResponse(content)
    if len(response.body) > max_bytes:
        raise RequestError(413, f"the response of {len(response.body)} bytes is over the server's cap "
                                f"max_response_bytes={max_bytes} (ask for fewer queries, rows or hits per request)")
    return response


def describe(retriever, limits: ServerLimits, engine: str, token: str | None) -> dict:
    """``/health`` without the counters: the index and the server's caps."""
    encoder, index = getattr(retriever, "encoder", None), getattr(retriever, "index", None)
    meta = getattr(index, "meta", None) or {}
    return {
        "status": "ok", "engine": engine, "auth": "bearer" if token else "none",
        "passages": len(retriever.corpus), "encoder": getattr(encoder, "name", None),
        "index_type": meta.get("factory"), "dim": getattr(index, "dim", None) or getattr(encoder, "dim", None),
        "backend": getattr(index, "backend", None), **asdict(limits),
    }


def build_app(retriever, search: Search, limits: ServerLimits, token: str | None = None, engine: str = "uvicorn",
              batch_stats: Callable[[], dict] | None = None,
              on_shutdown: Callable[[], Awaitable[None]] | None = None, docs: bool = False) -> FastAPI:
    """The four endpoints over ``retriever`` (its ``corpus``) and ``search`` (batched searches).

    ``app.state.served()`` returns the counters ``/health`` reports. ``/openapi.json`` describes
    the API; the interactive ``/docs`` page (Swagger UI, whose scripts a browser fetches from a
    CDN) only with ``docs``.
    """
    models, counts = request_models(limits), Counters()  # body models built at run time: mypy cannot read them as types

    @asynccontextmanager
    async def lifespan(_app):
        yield
        if on_shutdown is not None:
            await on_shutdown()

    bearer = [Security(HTTPBearer(auto_error=False))] if token else []  # shown in /docs; Guard checks it
    app = FastAPI(title="seeds-rl retrieval server", version="2", lifespan=lifespan, dependencies=bearer,
                  description="Search an index (/search), Search-R1's /retrieve, passages by row, health.",
                  docs_url="/docs" if docs else None, redoc_url=None)
    app.add_middleware(Guard, token=token, limits=limits, counts=counts)

    def served() -> dict:
        stats: Any = getattr(retriever, "stats", None)
        calls = {"retriever_calls": stats.calls} if hasattr(stats, "calls") else {}
        return {**counts.counts, **calls, **(batch_stats() if batch_stats else {})}

    app.state.served, app.state.counts = served, counts

    def capped(content: dict) -> JSONResponse:
        return capped_json(content, limits.max_response_bytes)

    async def run_search(queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        check_hits(len(queries), k, limits)
        counts.add("queries", len(queries))
        try:
            return await search(queries, k)
        except Exception as err:
            raise RequestError(500, f"retrieval failed: {type(err).__name__}: {err}") from err

    @app.post("/search", response_model=SearchResponse, responses=ERRORS)
    async def search_endpoint(body: models.search) -> JSONResponse:  # type: ignore[name-defined]
        """Top-``k`` hits per query: ``{"results": [[hit, ...] per query]}``."""
        counts.add("requests_search")
        hits = await run_search(body.queries, body.k)
        return capped({"results": [[hit_json(h) for h in row] for row in hits]})

    @app.post("/retrieve", response_model=RetrieveResponse, responses=ERRORS)
    async def retrieve_endpoint(body: models.retrieve) -> JSONResponse:  # type: ignore[name-defined]
        """Search-R1's endpoint: its request and response shapes."""
        counts.add("requests_retrieve")
        asked = [i for i, q in enumerate(body.queries) if q.strip()]
        found = await run_search([body.queries[i] for i in asked], body.topk or SEARCH_R1_DEFAULT_TOPK)
        hits: list[list[Hit]] = [[] for _ in body.queries]
        for i, row in zip(asked, found):
            hits[i] = row
        return capped(search_r1_result(hits, body.return_scores))

    @app.post("/passages", response_model=PassagesResponse, responses=ERRORS)
    async def passages_endpoint(body: models.passages) -> JSONResponse:  # type: ignore[name-defined]
        """Passages by corpus row, in the order asked."""
        counts.add("requests_passages")
        corpus = retriever.corpus
        rows = check_rows(body.rows, len(corpus))
        get = corpus.get_many if hasattr(corpus, "get_many") else (lambda rs: [corpus[r] for r in rs])
        found = await run_in_threadpool(get, rows)
        counts.add("passages", len(rows))
        return capped({"passages": [passage_json(p) for p in found]})

    @app.get("/health", responses=ERRORS)
    async def health_endpoint() -> dict:
        """Index size, encoder, index type, the server's caps and served-request counters."""
        counts.add("requests_health")
        return {**describe(retriever, limits, engine, token), "served": served()}

    _add_error_handlers(app, limits, counts)
    return app


def _add_error_handlers(app: FastAPI, limits: ServerLimits, counts: Counters) -> None:
    """Every refusal as ``{"error": reason}``: validation (400/413), unknown paths and methods, 500s."""

    def refuse(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
        counts.add("errors_5xx" if status >= 500 else "errors_4xx")
        return JSONResponse({"error": reason}, status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, err: RequestError) -> JSONResponse:
        return refuse(err.status, err.reason, err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, err: RequestValidationError) -> JSONResponse:
        return refuse(*describe_validation_error(list(err.errors()), limits))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        path = request.url.path.rstrip("/") or "/"
        if err.status_code == 404:
            endpoints = ", ".join(f"{m} {p}" for p, m in ROUTES.items())
            return refuse(404, f"unknown path {path}; endpoints: {endpoints} (the API: /docs)")
        if err.status_code == 405 and path in ROUTES:
            return refuse(405, f"{path} takes {ROUTES[path]}, not {request.method}", {"Allow": ROUTES[path]})
        return refuse(err.status_code, str(err.detail), dict(err.headers or {}))

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, err: Exception) -> JSONResponse:
        if isinstance(err, asyncio.CancelledError):
            raise err
        return refuse(500, f"internal error: {type(err).__name__}: {err}")
