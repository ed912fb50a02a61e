"""Shared by the retrieval-server tests: the tiny hash-encoder index (from test_retriever), the
expected answers, a retriever that fails on demand, and a server on a free loopback port."""
from __future__ import annotations

import pytest
from test_retriever import TEXTS, index_dir, private_cache, write_corpus  # noqa: F401  (shared fixtures)

from envs.retrieval.retriever import Retriever
from envs.retrieval.server import RetrievalServer, ServerLimits
from envs.types import Hit

QUERIES = ["capital of Japan", "river Spree", "highest mountain", "currency of France", "Danube Vienna",
           "largest city", "English Channel", "Austria capital"]


@pytest.fixture
def local(index_dir):
    return Retriever.from_dir(index_dir, device="cpu")


@pytest.fixture
def reference(index_dir):
    """A second, independent retriever over the same index: the expected answers."""
    return Retriever.from_dir(index_dir, device="cpu")


def serve(retriever, token: str | None = None, **limits) -> RetrievalServer:
    """uvicorn on a free loopback port, in a background thread."""
    return RetrievalServer(retriever, "127.0.0.1", 0, ServerLimits(**limits), token=token).start()


def as_json(hit: Hit) -> dict:
    return {"id": hit.id, "title": hit.title, "text": hit.text, "score": hit.score, "rank": hit.rank, "row": hit.row}


class FlakyRetriever:
    """Fails its first ``failures`` searches, then answers like ``inner``."""

    def __init__(self, inner, failures=1):
        self.inner, self.corpus, self.failures, self.calls = inner, inner.corpus, failures, 0

    def search(self, queries, k):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("index shard went away")
        return self.inner.search(queries, k)


class StubRetriever:
    """No index: empty hits, an empty corpus (for command-line tests)."""

    corpus: list = []

    def search(self, queries, k):
        return [[] for _ in queries]
