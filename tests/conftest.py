"""Shared test fixtures: a small corpus and a word-overlap retriever over it.

The env tests need a deterministic retriever with no model; the index and retriever modules
have their own tests with real encoders and FAISS.
"""
from __future__ import annotations

import os
import re
import tempfile

import pytest

from envs.types import Hit, Passage, QAExample

PASSAGES = [
    ("p0", "Paris", "Paris is the capital and largest city of France. It lies on the Seine river."),
    ("p1", "France", "France is a country in Western Europe. Its capital is Paris and its currency is the euro."),
    ("p2", "Seine", "The Seine is a river in northern France that flows through Paris into the English Channel."),
    ("p3", "Berlin", "Berlin is the capital of Germany and its most populous city, on the river Spree."),
    ("p4", "Germany", "Germany is a country in Central Europe whose capital is Berlin."),
    ("p5", "Spree", "The Spree is a river in eastern Germany that flows through Berlin."),
    ("p6", "Tokyo", "Tokyo is the capital of Japan and one of the largest cities in the world."),
    ("p7", "Japan", "Japan is an island country in East Asia. Its capital is Tokyo."),
    ("p8", "Mount Fuji", "Mount Fuji is the highest mountain in Japan, southwest of Tokyo."),
    ("p9", "Euro",
     "The euro is the currency of most member states of the European Union, including France and Germany."),
    ("p10", "Danube", "The Danube is the second-longest river in Europe, flowing through Vienna and Budapest."),
    ("p11", "Vienna", "Vienna is the capital of Austria, on the river Danube."),
]

_WORD = re.compile(r"\w+")


USER_CACHE = os.environ.get("SEEDS_RL_CACHE") or os.path.expanduser("~/.cache/seeds-rl")


def pytest_configure(config):
    """Keep every cache the tests touch out of the user's seeds-rl cache ..."""
    os.environ["SEEDS_RL_CACHE"] = tempfile.mkdtemp(prefix="seeds-rl-test-cache-")


@pytest.fixture
def user_cache(monkeypatch):
    """... except converted models: tests of the real offline models reuse the user's cache, so the
    one-off GGUF conversion (about a minute for Gemma 3 270M) happens once per machine."""
    monkeypatch.setenv("SEEDS_RL_CACHE", USER_CACHE)
    return USER_CACHE


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


class OverlapRetriever:
    """Ranks passages by shared words with the query (ties by row); counts its calls."""

    def __init__(self, passages=PASSAGES):
        self.corpus = [Passage(i, pid, title, text) for i, (pid, title, text) in enumerate(passages)]
        self.calls: list[list[str]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        out = []
        for query in queries:
            q = _words(query)
            scored = sorted(self.corpus, key=lambda p: (-len(q & _words(p.title + " " + p.text)), p.row))
            out.append([Hit.from_passage(p, len(q & _words(p.title + " " + p.text)), r)
                        for r, p in enumerate(scored[:k], 1)])
        return out


@pytest.fixture
def retriever() -> OverlapRetriever:
    return OverlapRetriever()


@pytest.fixture
def examples() -> list[QAExample]:
    return [
        QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0", "p1")),
        QAExample("q1", "Which river flows through Berlin?", ("Spree", "River Spree")),
        QAExample("q2", "What is the capital of Japan?", ("Tokyo",), positive_titles=("Tokyo",)),
        QAExample("q3", "Which river flows through Vienna?", ("Danube",)),
    ]
