"""What the retrieval server accepts and returns: limits, request validation, JSON shapes.

Every check raises :class:`RequestError` with the HTTP status and a reason for the client;
bodies are parsed by ``json`` only. The Search-R1 shapes are documented at
:func:`search_r1_result`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from envs.types import Hit, Passage

DEFAULT_K = 5  # /search without "k" (the env's K)
SEARCH_R1_DEFAULT_TOPK = 3  # /retrieve without "topk" (Search-R1's retrieval_server.py --topk default)
ROUTES = {"/search": "POST", "/retrieve": "POST", "/passages": "POST", "/health": "GET"}


@dataclass
class ServerLimits:
    """Batching and request caps (the command-line flags of the same names)."""

    max_batch: int = 256  # queries per retriever call; 1 = one request at a time
    max_wait_ms: float = 5.0  # how long the worker waits for more requests after the first
    max_queries_per_request: int = 256
    max_k: int = 100
    max_body_bytes: int = 4 << 20
    max_rows_per_request: int = 1024  # /passages

    def __post_init__(self):
        for name in ("max_batch", "max_queries_per_request", "max_k", "max_body_bytes", "max_rows_per_request"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with a reason for the client."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


# ============================================================================== request parsing


def _positive_int(value: Any, name: str, cap: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"{name} must be a positive integer, got {json.dumps(value)}")
    if value > cap:
        raise RequestError(400, f"{name}={value} is over the server's cap of {cap}")
    return value


def _queries(body: dict, limits: ServerLimits, allow_empty_strings: bool = False) -> list[str]:
    if "queries" not in body:
        raise RequestError(400, "missing field 'queries' (a list of strings)")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise RequestError(400, f"'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > limits.max_queries_per_request:
        raise RequestError(413, f"{len(queries)} queries in one request; the server's cap is "
                                f"{limits.max_queries_per_request} (split the request)")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(400, f"queries[{i}] must be a string, got {type(query).__name__}")
        if not allow_empty_strings and not query.strip():
            raise RequestError(400, f"queries[{i}] is empty")
    return queries


def parse_search(body: dict, limits: ServerLimits) -> tuple[list[str], int]:
    """``/search``: ``(queries, k)``."""
    return _queries(body, limits), _positive_int(body.get("k", DEFAULT_K), "k", limits.max_k)


def parse_retrieve(body: dict, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """``/retrieve`` (Search-R1): ``(queries, topk, return_scores)``.

    Empty query strings are accepted here (they get an empty result list): Search-R1's agent sends
    the stripped text of every ``<search></search>`` in a batch, so one empty tag must not fail
    the whole batch. A missing or null ``topk`` means 3, like Search-R1's server.
    """
    queries = _queries(body, limits, allow_empty_strings=True)
    topk = body.get("topk")
    topk = SEARCH_R1_DEFAULT_TOPK if topk is None else _positive_int(topk, "topk", limits.max_k)
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(400, f"'return_scores' must be true or false, got {json.dumps(return_scores)}")
    return queries, topk, return_scores


def parse_rows(body: dict, limits: ServerLimits, n_passages: int) -> list[int]:
    """``/passages``: corpus rows, each in ``0 .. n_passages-1``."""
    rows = body.get("rows")
    if not isinstance(rows, list):
        raise RequestError(400, "'rows' must be a list of corpus row numbers")
    if len(rows) > limits.max_rows_per_request:
        raise RequestError(413, f"{len(rows)} rows in one request; the server's cap is {limits.max_rows_per_request}")
    for i, row in enumerate(rows):
        if isinstance(row, bool) or not isinstance(row, int):
            raise RequestError(400, f"rows[{i}] must be an integer, got {json.dumps(row)}")
        if not 0 <= row < n_passages:
            raise RequestError(400, f"rows[{i}]={row} is out of range for a corpus of {n_passages} passages")
    return rows


# ============================================================================== response shapes


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
