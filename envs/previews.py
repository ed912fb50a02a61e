"""Cheap, query-aware previews of retrieved passages (SEEDS appendix B).

A preview is the title (first 80 characters) plus the 240-character window of the passage
text holding the most query-term occurrences (stopwords ignored), capped at 60 tokens.
No model call is made.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from envs.tokens import TokenCounter

_WORD = re.compile(r"\w+", re.UNICODE)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom why will
    with would you your yours yourself yourselves""".split()
)


@dataclass(frozen=True)
class PreviewConfig:
    title_chars: int = 80  # characters of the title kept in a preview
    window_chars: int = 240  # characters of the passage window (the one with most query-term hits) shown
    max_tokens: int = 60  # token cap of one preview


def query_terms(query: str) -> frozenset[str]:
    """Lower-cased content words of a query."""
    return frozenset(w for w in (m.group().lower() for m in _WORD.finditer(query)) if w not in STOPWORDS)


def best_window(text: str, terms: frozenset[str], width: int) -> str:
    """The ``width``-character window, starting and ending on word boundaries, with most term hits.

    Two pointers over the word list keep this linear in the passage length; ties go to the
    earliest window, so a passage with no matching term previews its opening.
    """
    start, end = best_window_span(text, terms, width)
    return text[start:end]


def best_window_span(text: str, terms: frozenset[str], width: int) -> tuple[int, int]:
    """Character span ``(start, end)`` of :func:`best_window`."""
    words = list(_WORD.finditer(text))
    if len(text) <= width or not words:
        stripped = text[:width].strip()
        start = text.find(stripped) if stripped else 0
        return start, start + len(stripped)
    hits = [1 if w.group().lower() in terms else 0 for w in words]
    best_start, best_end, best_score = 0, 0, -1
    end, score = 0, 0
    for start in range(len(words)):
        if end < start:
            end, score = start, 0
        while end < len(words) and words[end].end() - words[start].start() <= width:
            score += hits[end]
            end += 1
        if score > best_score:
            best_start, best_end, best_score = start, end, score
        if end > start:
            score -= hits[start]
    start = words[best_start].start()
    if best_end <= best_start:  # a single word longer than the window
        return start, start + width
    return start, words[best_end - 1].end()


def make_preview(title: str, text: str, query: str, config: PreviewConfig, counter: TokenCounter) -> str:
    """``"Title: window"`` for one passage, capped at ``config.max_tokens`` tokens.

    ``...`` marks text left out before or after the window (or cut by the token cap).
    """
    start, end = best_window_span(text, query_terms(query), config.window_chars)
    window = ("... " if text[:start].strip() else "") + text[start:end]
    preview = f"{title[: config.title_chars]}: {window}" if title else window
    preview, cut = counter.truncate(preview, config.max_tokens)
    return preview + " ..." if cut or text[end:].strip() else preview
