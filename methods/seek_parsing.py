"""Reading SEEK's model output tolerantly: gists, sub-queries, evidence, verdicts, sketch revisions.

Every parser returns something usable or an explicit "nothing found" (``[]``, ``""``, ``None``)
that :mod:`methods.seek` turns into a recorded fallback; none raises on any text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from methods.parsing import last_tag
from methods.prompts import seek as prompts

GIST_CHARS = 120
QUERY_WORDS = 32
EVIDENCE_CHARS = 600
GROUNDED_SHARE = 0.7  # an edited evidence text must reuse this share of its words from the old evidence

_ITEM = re.compile(r"^\s*[*_]*(?:#{2,6}|(?:step|topic)?\s*\d{1,2}\s*[.):]|[-*•])\s*(.+?)\s*$", re.IGNORECASE)
_NUMBERED = re.compile(r"^\s*(?:query\s*)?(\d{1,2})\s*[.):]\s*(.+?)\s*$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"<\s*to be filled\s*>|\[\s*(?:to be filled)?\s*\]|\(\s*empty\s*\)", re.IGNORECASE)
_LABEL = re.compile(r"^\W*(?:sub-?query|search query|query|search|evidence|note|summary)\s*:\s*", re.IGNORECASE)
_QUERY_LINE = re.compile(r"^\W*(?:sub-?query|search query|query)\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_VERDICT = re.compile(r"\b(yes|no|not|insufficient|sufficient|enough)\b", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"</?[A-Za-z_]+>")
_EVIDENCE_LINE = re.compile(r"^\W*evidence\s*:\**\s*(.*)$", re.IGNORECASE)
_INLINE_EVIDENCE = re.compile(r"\s*[-–—|]?\s*\**\bevidence\s*:\**\s*", re.IGNORECASE)
_KEEP = re.compile(r"\bkeep\b|\bno change|\bunchanged\b|\bfine as it is\b", re.IGNORECASE)


def norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def says_keep(text: str) -> bool:
    """Whether a sketch-update reply asks to keep the sketch as it is."""
    return bool(_KEEP.search(text))


def _gist(item: str) -> str:
    return " ".join(_PLACEHOLDER.sub(" ", item).replace("**", "").split()).strip(" :-")


def after_marker(text: str, marker: str) -> str:
    """The text after the last line that opens with ``marker``'s word (case and markup aside;
    what follows it on that line is kept), or all of ``text`` when no line does: the topic list
    after a sketch call's analysis, whose own numbered lines are not topics."""
    opening = re.compile(rf"^\W*{re.escape(norm(marker))}\b\W*(.*)$", re.IGNORECASE)
    lines = text.splitlines()
    found = [(i, match) for i, line in enumerate(lines) if (match := opening.match(line))]
    if not found:
        return text
    last, match = found[-1]
    return "\n".join([match.group(1), *lines[last + 1:]])


def parse_gists(text: str) -> list[str]:
    """Topic names from numbered (``1.``), bulleted or ``##`` lines, in order, deduplicated."""
    gists, seen = [], set()
    for line in text.splitlines():
        match = _ITEM.match(line)
        if not match:
            continue
        gist = _gist(match.group(1))
        key = norm(gist)
        if key and key not in seen and not key.startswith("evidence"):
            seen.add(key)
            gists.append(gist[:GIST_CHARS])
    return gists


def _clean_query(text: str) -> str:
    words = _LABEL.sub("", text).replace("**", "").strip().strip("\"'`").split()
    return " ".join(words[:QUERY_WORDS])


def parse_query(text: str) -> str:
    """The sub-query: a ``Query:`` line, a ``<search>`` tag, else the last line that is not reasoning."""
    found = _QUERY_LINE.search(text)
    if found and _clean_query(found.group(1)):
        return _clean_query(found.group(1))
    tagged = last_tag(text, "search")
    if tagged:
        return _clean_query(tagged)
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"^\W*reasoning\b", ln, re.IGNORECASE)]
    return _clean_query(lines[-1]) if lines else ""


def parse_numbered_queries(text: str) -> dict[int, str]:
    """``{topic number: query}`` from ``1. query`` lines; unnumbered lines count in order."""
    numbered = {int(m.group(1)): _clean_query(m.group(2)) for m in map(_NUMBERED.match, text.splitlines()) if m}
    if numbered:
        return {i: q for i, q in numbered.items() if q}
    plain = [_clean_query(ln) for ln in text.splitlines() if ln.strip()]
    return {i: q for i, q in enumerate(plain, 1) if q}


def clean_evidence(text: str, gists: list[str]) -> str:
    """The evidence written for one slot, without echoed outline lines, placeholders or labels."""
    echoes = {norm(g) for g in gists} | {norm(h) for h in (prompts.OUTLINE_HEADING, prompts.PLAN_HEADING,
                                                              prompts.NOTES_HEADING)}
    kept = []
    for line in _TAG.sub(" ", _THINK.sub(" ", text)).splitlines():
        item = _ITEM.match(line)
        if "to be filled" in line.lower() or norm(line) in echoes or (item and norm(item.group(1)) in echoes):
            continue
        kept.append(_LABEL.sub("", line.strip()))
    return " ".join(" ".join(kept).split())[:EVIDENCE_CHARS]


def parse_verdict(text: str) -> bool | None:
    """True for yes/sufficient/enough, False for no/not/insufficient (first word that says), else None."""
    found = _VERDICT.search(text)
    return None if found is None else found.group(1).lower() in ("yes", "sufficient", "enough")


@dataclass
class Revision:
    """One topic of a revised sketch: its name and, when the reply gave an ``Evidence:`` line
    (``stated``), the evidence written there (None for an emptied slot, ``[to be filled]``)."""

    gist: str
    evidence: str | None = None
    stated: bool = False

    def add_evidence(self, text: str) -> None:
        text = " ".join(text.replace("**", "").split())
        if not self.stated:
            self.stated, self.evidence = True, None
        if text and not _PLACEHOLDER.fullmatch(text) and norm(text) != "to be filled":
            self.evidence = f"{self.evidence} {text}" if self.evidence else text


def parse_sketch_revision(text: str) -> list[Revision]:
    """A whole revised sketch: numbered topic lines, each optionally followed by (or ending in) an
    ``Evidence: …`` line; other lines are ignored. Topics deduplicated in order."""
    revisions: list[Revision] = []
    for line in _TAG.sub(" ", _THINK.sub(" ", text)).splitlines():
        evidence = _EVIDENCE_LINE.match(line)
        item = None if evidence else _ITEM.match(line)
        if evidence and revisions:
            revisions[-1].add_evidence(evidence.group(1))
        elif item:
            name, *inline = _INLINE_EVIDENCE.split(item.group(1), maxsplit=1)
            gist = _gist(name)[:GIST_CHARS]
            if norm(gist) and not norm(gist).startswith("evidence"):
                revisions.append(Revision(gist))
                if inline:
                    revisions[-1].add_evidence(inline[0])
    unique: dict[str, Revision] = {}
    for revision in revisions:
        unique.setdefault(norm(revision.gist), revision)
    return list(unique.values())


def grounded(text: str, source: str) -> bool:
    """Whether ``text`` reuses at least GROUNDED_SHARE of its words (three letters or more, or all
    words if it has none that long) from ``source``: an edit may cut, reword or move evidence,
    not bring in facts that were never retrieved."""
    words = re.findall(r"\w+", text.lower())
    long_words = [w for w in words if len(w) >= 3] or words
    if not long_words:
        return True
    known = set(re.findall(r"\w+", source.lower()))
    return sum(w in known for w in long_words) >= GROUNDED_SHARE * len(long_words)
