"""Reading MAPS's model output tolerantly: directions, sub-queries, judgements, refinements.

Every parser returns something usable or an explicit "nothing found" (``[]``, ``None``) that
:mod:`methods.maps` turns into a recorded fallback; none raises on any text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from methods.parsing import last_tag

MAX_QUERY_WORDS = 32
MAX_DIRECTION_WORDS = 24
# the format line, or a memory placeholder, copied back verbatim
_PLACEHOLDERS = {"search query", "what to find out", "nothing new", "no new", "nothing yet", "no reasoning yet",
                 "new", "none", "search", "query", "direction"}

_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.):]|\(\d+\))\s*")
_DIRECTION = re.compile(r"\**\bdirection\s*\d*\**\s*[:=]\**\s*(.*?)\s*(?=\||\bquery\s*\d*\**\s*[:=]|$)", re.IGNORECASE)
_QUERY = re.compile(r"\**\b(?:sub-?)?query\s*\d*\**\s*[:=]\**\s*(.+)", re.IGNORECASE)
_REFINE_LABEL = re.compile(r"\**\b(observation|new knowledge|knowledge|reasoning state|state)\**\s*:\**", re.IGNORECASE)
_JUDGEMENT = re.compile(r"\b(insufficient|not (?:yet )?(?:sufficient|enough)|sufficient|enough)\b", re.IGNORECASE)
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_VERDICT_LINE = re.compile(r"^\W*(?:(?:is\s+the\s+)?knowledge\s+)?(?:sufficient|sufficiency|enough|verdict|judgement)"
                           r"\w*\W*\s*[:=]\s*(.*)$", re.IGNORECASE)
_REASONING_LINE = re.compile(r"^\W*(?:reasoning|thought|think)\b", re.IGNORECASE)


@dataclass
class Search:
    """One planned sub-query and the retrieval direction it serves (None without directions)."""

    query: str
    direction: str | None = None


def clean(text: str) -> str:
    """One line without tags, surrounding quotes/brackets/markdown or repeated spaces."""
    text = re.sub(r"</?\w+>", " ", text)
    return " ".join(text.strip().strip("\"'`*[]<>").split())


def normalised(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _unique(items: list[str], limit: int) -> list[str]:
    """Non-empty, non-placeholder items, deduplicated (case and punctuation ignored), at most ``limit``."""
    kept: dict[str, str] = {}
    for item in items:
        key = normalised(item)
        if key and key not in _PLACEHOLDERS and key not in kept:
            kept[key] = item
    return list(kept.values())[:limit]


def parse_plan(text: str, limit: int) -> list[Search]:
    """Sub-queries (with directions where given) from a one-call plan, tolerantly: one per line,
    as ``direction: … | query: …``, ``query: …``, a ``direction:`` line followed by a ``query:``
    line, or a bulleted/numbered line (``- a | b`` or ``1. query``). A direction without a query
    is searched as written. Deduplicated (case and punctuation ignored), at most ``limit``."""
    searches: list[Search] = []
    pending: str | None = None  # a direction waiting for its query on a later line
    for line in text.splitlines():
        if _VERDICT_LINE.match(line):
            continue
        direction = _DIRECTION.search(line)
        query = _QUERY.search(line)
        if query:
            searches.append(Search(clean(query.group(1)), clean(direction.group(1)) if direction else pending))
            pending = None
        elif direction:
            if pending:
                searches.append(Search(pending, pending))
            pending = clean(direction.group(1)) or None
        elif _LIST_MARK.match(line) and clean(_LIST_MARK.sub("", line)):
            aim, _, rest = _LIST_MARK.sub("", line).rpartition("|")
            searches.append(Search(clean(rest), clean(aim) or None))
    if pending:
        searches.append(Search(pending, pending))
    for search in searches:
        search.query = " ".join(search.query.split()[:MAX_QUERY_WORDS])
    by_query = {normalised(s.query): s for s in reversed(searches)}  # first occurrence wins
    return [by_query[normalised(q)] for q in _unique([s.query for s in searches], limit)]


def parse_directions(text: str, limit: int) -> list[str]:
    """Retrieval directions, one per line: ``direction: …`` (a ``| query: …`` tail is dropped) or a
    bulleted/numbered item; the sufficiency line is skipped. Deduplicated, at most ``limit``."""
    directions = []
    for line in text.splitlines():
        if _VERDICT_LINE.match(line):
            continue
        labelled = _DIRECTION.search(line)
        if labelled:
            directions.append(clean(labelled.group(1)))
        elif _LIST_MARK.match(line):
            directions.append(clean(_LIST_MARK.sub("", line).split("|")[0]))
    return _unique([" ".join(d.split()[:MAX_DIRECTION_WORDS]) for d in directions], limit)


def parse_sub_query(text: str) -> tuple[str, str]:
    """``(query, form)`` from one sub-query reply: form ``label`` (a ``query:`` line), ``tag`` (a
    ``<search>`` tag), ``line`` (an unlabelled one-line reply of at most MAX_QUERY_WORDS words,
    reasoning lines ignored) or ``none`` (query "")."""
    labelled = [clean(m.group(1)) for m in map(_QUERY.search, text.splitlines()) if m]
    labelled = [q for q in labelled if q and normalised(q) not in _PLACEHOLDERS]
    if labelled:
        return " ".join(labelled[0].split()[:MAX_QUERY_WORDS]), "label"
    tagged = last_tag(text, "search")
    if tagged and clean(tagged):
        return " ".join(clean(tagged).split()[:MAX_QUERY_WORDS]), "tag"
    lines = [clean(ln) for ln in re.sub(r"<think>.*?(?:</think>|$)", " ", text, flags=re.DOTALL).splitlines()]
    lines = [ln for ln in lines if ln and not _REASONING_LINE.match(ln) and not _QUERY.search(ln)]
    if len(lines) == 1 and len(lines[0].split()) <= MAX_QUERY_WORDS and normalised(lines[0]) not in _PLACEHOLDERS:
        return lines[0], "line"
    return "", "none"


def parse_refinement(text: str) -> tuple[str | None, str | None]:
    """``(observation, state)`` from ``Observation: …`` / ``State: …`` lines; None where absent."""
    parts: dict[str, str] = {}
    labels = list(_REFINE_LABEL.finditer(text))
    for label, following in zip(labels, labels[1:] + [None]):
        body = clean(text[label.end(): following.start() if following else len(text)])
        kind = "state" if "state" in label.group(1).lower() else "observation"
        if body and kind not in parts:
            parts[kind] = body
    return parts.get("observation"), parts.get("state")


def parse_judgement(text: str) -> str | None:
    """``sufficient`` / ``insufficient`` from a judge's reply (first verdict word); None if unclear."""
    found = _JUDGEMENT.search(text)
    if found:
        word = found.group(1).lower()
        return "sufficient" if word in ("sufficient", "enough") else "insufficient"
    yes_no = _YES_NO.search(text)
    if yes_no:
        return "sufficient" if yes_no.group(1).lower() == "yes" else "insufficient"
    return None


def parse_sufficiency(text: str) -> str | None:
    """The verdict that opens a planning reply: a ``Sufficient: yes/no`` line anywhere, else the
    first non-empty line when it is not a direction or query line; None if neither says."""
    for line in text.splitlines():
        labelled = _VERDICT_LINE.match(line)
        if labelled:
            return parse_judgement(labelled.group(1)) or parse_judgement(line)
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if not first or _DIRECTION.search(first) or _QUERY.search(first) or _LIST_MARK.match(first):
        return None
    return parse_judgement(first)
