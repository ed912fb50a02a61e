"""What the reader gets from an opened web result: about 3,000 characters of its page around the snippet.

SEEDS's live-web setting previews each search result by its title and snippet and fetches a page
only once the agent admits (opens) it; the reader is then given the ~3,000 characters of the page
around the snippet. :func:`reader_window` is that cut: the snippet is located in the page text
(case-insensitive, whitespace collapsed; a snippet the engine shortened with ``...`` by its longest
piece of three words or more; else the page sentence sharing most content words with it) and the
window is centred on it; a page where nothing matches gives its opening ``width`` characters.

A page that cannot be read (HTTP error, timeout, a host the SSRF guard refuses, not HTML or text)
gives :func:`unreadable_page_text`: the snippet behind a short note saying so, never an empty passage.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from envs.previews import query_terms

DEFAULT_READER_CHARS = 3000  # SEEDS: the reader sees ~3,000 characters of an opened page
MIN_FRAGMENT_WORDS = 3  # a shorter piece of an elided snippet would match by chance
_ELISION = re.compile(r"\s*(?:\.\.\.|\u2026)\s*")
_SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")


@dataclass(frozen=True)
class OpenedPage:
    """What opening one candidate gave. ``text``: the reader's input (the window, or the snippet with a
    note); ``page``: a page was asked for (fetched now, or served by the run's cache); ``error``: why the
    page could not be read (None when it was)."""

    text: str
    page: bool = True
    error: str | None = None


def collapse(text: str) -> str:
    """``text`` with every run of whitespace (line breaks included) made one space."""
    return " ".join(text.split())


def snippet_span(text: str, snippet: str) -> tuple[int, int] | None:
    """Character span of ``snippet`` in ``text`` (both whitespace-collapsed), or None when neither the
    snippet, nor a piece of it, nor a sentence sharing a content word with it is there."""
    lower, needle = text.lower(), collapse(snippet).lower()
    if not needle:
        return None
    pieces = sorted((p for p in _ELISION.split(needle) if len(p.split()) >= MIN_FRAGMENT_WORDS),
                    key=len, reverse=True)
    for piece in [needle, *pieces]:
        at = lower.find(piece)
        if at >= 0:
            return at, at + len(piece)
    terms = query_terms(snippet)
    best, best_overlap = None, 0
    for sentence in _SENTENCE.finditer(text):
        overlap = len(terms & query_terms(sentence.group()))
        if overlap > best_overlap:  # ties: the earliest sentence
            best, best_overlap = sentence, overlap
    if best is None:
        return None
    start = best.start() + len(best.group()) - len(best.group().lstrip())
    return start, best.end()


def reader_window(page_text: str, snippet: str, width: int = DEFAULT_READER_CHARS) -> str:
    """At most ``width`` characters of ``page_text`` (whitespace collapsed) centred on the snippet
    (:func:`snippet_span`), cut on word boundaries; a snippet longer than the window gives its first
    ``width`` characters; no match gives the page's opening."""
    if width < 1:
        raise ValueError(f"the reader window must be at least one character, got {width}")
    text = collapse(page_text)
    if len(text) <= width:
        return text
    span = snippet_span(text, snippet) or (0, 0)
    start, end = span
    if end - start >= width:
        low = start
    else:
        low = max(0, min((start + end) // 2 - width // 2, len(text) - width))
    high = min(low + width, len(text))
    if low > 0 and not text[low - 1].isspace():  # do not start inside a word ...
        space = text.find(" ", low, start + 1)
        low = space + 1 if space >= 0 else low
    if high < len(text) and not text[high].isspace():  # ... nor end inside one
        space = text.rfind(" ", max(low, end), high)
        high = space if space > low else high
    return text[low:high].strip()


def unreadable_page_text(snippet: str, error: str) -> str:
    """The reader's input for a page that could not be read: a short note, then the snippet."""
    reason = error.removeprefix("transient: ").split(";")[0].strip()
    reason = reason if len(reason) <= 100 else reason[:97] + "..."
    note = f"[The page could not be read ({reason}); only the search result's snippet is available.]"
    return f"{note} {collapse(snippet)}".strip()
