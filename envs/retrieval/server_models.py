"""What the retrieval server accepts and returns: limits, pydantic request and response models.

The limits (:class:`ServerLimits`, the server's command-line flags) are declared once, in the
request models that :func:`request_models` builds from them: FastAPI validates every body against
those models and ``/docs`` shows them, caps included. :func:`describe_validation_error` turns
pydantic's errors into one status and reason for the client (a cap names itself). The Search-R1
shapes are documented at :func:`search_r1_result`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StringConstraints, field_validator

from envs.types import Hit, Passage

DEFAULT_K = 5  # /search without "k" (the env's K)
SEARCH_R1_DEFAULT_TOPK = 3  # /retrieve without "topk" (Search-R1's retrieval_server.py --topk default)
ROUTES = {"/search": "POST", "/retrieve": "POST", "/passages": "POST", "/health": "GET"}


@dataclass
class ServerLimits:
    """Batching, request, connection and time caps (the command-line flags of the same names).

    The connection and time caps (``max_header_bytes`` .. ``keep_alive_s``) are the uvicorn
    engine's (Ray Serve's proxy has its own); the others hold for both engines.
    """

    max_batch: int = 256  # queries per retriever call; 1 = one request at a time
    max_wait_ms: float = 5.0  # how long a batch waits for more requests after its first
    max_queries_per_request: int = 256
    max_query_chars: int = 4096  # one query's length in characters (encoders truncate far below this)
    max_k: int = 100
    max_body_bytes: int = 4 << 20
    max_rows_per_request: int = 1024  # /passages
    max_hits_per_request: int = 4096  # queries x k of one /search or /retrieve
    max_response_bytes: int = 8 << 20  # one response's JSON
    max_slice_chars: int = 8192  # query characters of one request per batch: a large request takes turns
    max_header_bytes: int = 16384  # the request line and headers together
    max_headers: int = 100  # header lines of one request
    max_connections: int = 1024  # open connections and requests in progress; beyond it a request gets 503
    header_timeout_s: float = 10.0  # to send a whole request head, from connecting or from the first byte
    body_timeout_s: float = 30.0  # to send a whole body, from the end of the head
    keep_alive_s: float = 15.0  # an idle kept-alive connection is closed after this

    def __post_init__(self):
        for name in ("max_batch", "max_queries_per_request", "max_query_chars", "max_k", "max_body_bytes",
                     "max_rows_per_request", "max_hits_per_request", "max_response_bytes", "max_slice_chars",
                     "max_header_bytes", "max_headers", "max_connections"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"{name} must be > 0")


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with a reason for the client."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


# ============================================================================== request models


class RequestModels:
    """The three request bodies, with ``limits`` built into their field constraints."""

    def __init__(self, search: type[BaseModel], retrieve: type[BaseModel], passages: type[BaseModel]):
        self.search, self.retrieve, self.passages = search, retrieve, passages


def request_models(limits: ServerLimits) -> RequestModels:
    """Pydantic models of ``/search``, ``/retrieve`` and ``/passages`` bodies under ``limits``.

    Strict types: ``"3"``, ``true`` or ``3.0`` is not a ``k``, ``3`` is not a query. Unknown
    fields are ignored (Search-R1 clients may send more than we read).
    """
    query = Annotated[str, StringConstraints(strict=True, max_length=limits.max_query_chars)]
    queries = Annotated[list[query], Field(max_length=limits.max_queries_per_request,
                                           description="query strings, at most max_queries_per_request")]
    k_type = Annotated[StrictInt, Field(ge=1, le=limits.max_k)]

    class SearchRequest(BaseModel):
        """``POST /search``: top-``k`` hits for each query."""

        model_config = ConfigDict(extra="ignore")
        queries: queries
        k: k_type = DEFAULT_K

        @field_validator("queries")
        @classmethod
        def no_empty_query(cls, value: list[str]) -> list[str]:
            for i, text in enumerate(value):
                if not text.strip():
                    raise ValueError(f"queries[{i}] is empty")
            return value

    class RetrieveRequest(BaseModel):
        """``POST /retrieve``, Search-R1's request. Empty query strings get an empty result list
        (Search-R1's agent sends every ``<search></search>`` of a batch; one empty tag must not
        fail the batch); a missing or null ``topk`` means 3, like Search-R1's server."""

        model_config = ConfigDict(extra="ignore")
        queries: queries
        topk: k_type | None = None
        return_scores: StrictBool = False

    class PassagesRequest(BaseModel):
        """``POST /passages``: passages by corpus row."""

        model_config = ConfigDict(extra="ignore")
        rows: Annotated[list[StrictInt], Field(max_length=limits.max_rows_per_request,
                                               description="corpus rows, at most max_rows_per_request")]

    return RequestModels(SearchRequest, RetrieveRequest, PassagesRequest)


_CAPPED = {  # (field, pydantic error type) -> the limit it broke, and the status
    ("queries", "too_long"): ("max_queries_per_request", 413, "queries in one request"),
    ("queries[]", "string_too_long"): ("max_query_chars", 413, "characters in one query"),
    ("rows", "too_long"): ("max_rows_per_request", 413, "rows in one request"),
    ("k", "less_than_equal"): ("max_k", 400, ""),
    ("topk", "less_than_equal"): ("max_k", 400, ""),
}


def describe_validation_error(errors: list[dict[str, Any]], limits: ServerLimits) -> tuple[int, str]:
    """One ``(status, reason)`` from pydantic's (FastAPI's) validation errors of a request body."""
    error = errors[0]
    loc = [part for part in error.get("loc", ()) if part != "body"]
    kind, message = error.get("type", ""), str(error.get("msg", "invalid"))
    field = "".join(f"[{part}]" if isinstance(part, int) else (f".{part}" if i else str(part))
                    for i, part in enumerate(loc))
    if kind == "json_invalid":
        return 400, f"body is not valid JSON: {error.get('ctx', {}).get('error', message)}"
    if not loc and kind in ("model_attributes_type", "dict_type", "model_type"):
        return 400, "body must be a JSON object"
    if not loc and kind == "missing":
        return 400, "a JSON body is required"
    if kind == "missing":
        return 400, f"missing field '{field}'"
    capped = _CAPPED.get((f"{loc[0]}[]" if len(loc) == 2 and isinstance(loc[1], int) else str(loc[0]), kind))
    if capped is not None:
        name, status, what = capped
        got = error.get("input")
        size = len(got) if isinstance(got, (list, str)) else got
        cap = f"the server's cap {name}={getattr(limits, name)}"
        if isinstance(got, int):
            return status, f"{field}={got} is over {cap}"
        return status, (f"{field}: {size} {what} is over {cap}"
                        + (" (split the request)" if name.endswith("per_request") else ""))
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        return 400, message
    return 400, f"{field or 'body'}: {message}"


def check_rows(rows: list[int], n_passages: int) -> list[int]:
    """``/passages``: every row in ``0 .. n_passages-1``, else a 400 naming the first that is not."""
    for i, row in enumerate(rows):
        if not 0 <= row < n_passages:
            raise RequestError(400, f"rows[{i}]={row} is out of range for a corpus of {n_passages} passages")
    return rows


# ============================================================================== response models


class HitModel(BaseModel):
    id: str
    title: str
    text: str
    score: float
    rank: int
    row: int


class SearchResponse(BaseModel):
    results: list[list[HitModel]] = Field(description="per query, its hits best first")


class PassageModel(BaseModel):
    row: int
    id: str
    title: str
    text: str


class PassagesResponse(BaseModel):
    passages: list[PassageModel]


class SearchR1Document(BaseModel):
    id: str
    contents: str = Field(description='"Title"\\ntext, as in Search-R1\'s wiki-18.jsonl')


class SearchR1ScoredDocument(BaseModel):
    document: SearchR1Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[SearchR1ScoredDocument] | list[SearchR1Document]] = Field(
        description="per query: {document, score} items with return_scores, else the bare documents")


class ErrorResponse(BaseModel):
    error: str


def hit_json(hit: Hit) -> dict:
    return {"id": hit.id, "title": hit.title, "text": hit.text, "score": hit.score, "rank": hit.rank, "row": hit.row}


def passage_json(passage: Passage) -> dict:
    return {"row": passage.row, "id": passage.id, "title": passage.title, "text": passage.text}


def search_r1_document(hit: Hit) -> dict:
    """A corpus row as Search-R1 stores it: wiki-18.jsonl's ``{"id", "contents": '"Title"\\ntext'}``."""
    return {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'}


def search_r1_result(hits_per_query: list[list[Hit]], return_scores: bool) -> dict:
    """Search-R1's ``/retrieve`` response, ``{"result": [per query: [...]]}``.

    Matched against PeterGriffinJin/Search-R1: ``search_r1/search/retrieval_server.py``
    (``retrieve_endpoint`` appends ``{"document": doc, "score": score}`` per hit when
    ``return_scores``, else the bare documents) and the agent that reads it,
    ``search_r1/llm_agent/generation.py`` (``_batch_search(...)['result']``, then
    ``doc_item['document']['contents']``, title = first line, text = the rest);
    ``search_r1/search/retrieval_request.py`` shows the request ``{"queries", "topk", "return_scores"}``.
    """
    if return_scores:
        return {"result": [[{"document": search_r1_document(h), "score": h.score} for h in hits]
                           for hits in hits_per_query]}
    return {"result": [[search_r1_document(h) for h in hits] for hits in hits_per_query]}
