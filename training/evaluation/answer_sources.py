"""Where a policy's answers come from: each episode's answer classified against what the episode
showed and opened (:data:`ANSWER_SOURCES`): the title of the first passage it opened, of another
opened one, of a candidate it was shown but did not open, a copy of the question, missing, or other
text. Every greedy evaluation of the trainer reports these shares (:data:`ANSWER_SHARE_KEYS`), and
the reader study (:mod:`training.studies.reader_study`) counts them.

Episodes are the env's summaries (``Episode.info`` of a rollout, ``summary`` of a trajectory
record): ``answer``, ``metrics.em`` and ``searches`` (``titles`` in the order shown, ``expanded``
1-based numbers in the order opened).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from envs.metrics import normalize_answer

ANSWER_SOURCES = ("first_opened", "other_opened", "shown_not_opened", "question_copy", "missing", "other")
QUESTION_COPY_OVERLAP = 0.6  # share of the answer's words in the question (and >= 5 words): a copied question


def opened_and_shown(summary: dict) -> tuple[list[str], list[str]]:
    """(titles opened, in the order opened; titles shown) over every search of an episode summary."""
    opened, shown = [], []
    for search in summary.get("searches") or ():
        titles = list(search.get("titles") or ())
        shown += titles
        opened += [titles[n - 1] for n in search.get("expanded") or () if 0 < n <= len(titles)]
    return opened, shown


def copies_question(answer: str, question: str) -> bool:
    """Whether ``answer`` is mostly the question's own words (at least 5 words, a share of at
    least :data:`QUESTION_COPY_OVERLAP` of them in the question)."""
    words = normalize_answer(answer).split()
    asked = set(normalize_answer(question).split())
    return len(words) >= 5 and sum(w in asked for w in words) / len(words) >= QUESTION_COPY_OVERLAP


def answer_source(summary: dict) -> str:
    """One of :data:`ANSWER_SOURCES` for an episode summary (titles compared normalised)."""
    answer = summary.get("answer")
    if answer is None or not str(answer).strip():
        return "missing"
    said = normalize_answer(str(answer))
    opened, shown = opened_and_shown(summary)
    opened_norm = [normalize_answer(t) for t in opened]
    if opened_norm and said == opened_norm[0]:
        return "first_opened"
    if said in opened_norm:
        return "other_opened"
    if said in {normalize_answer(t) for t in shown}:
        return "shown_not_opened"
    if copies_question(str(answer), summary.get("question", "")):
        return "question_copy"
    return "other"


def answer_sources(summaries: Sequence[dict]) -> dict[str, Any]:
    """Counts of :data:`ANSWER_SOURCES` over the episodes, with ``first_title_em``: the EM the
    episodes would have had answering with the first title they opened (their own openings)."""
    counts = Counter(answer_source(s) for s in summaries)
    golds = [{normalize_answer(g) for g in s.get("golden_answers") or ()} for s in summaries]
    first = [opened_and_shown(s)[0][:1] for s in summaries]
    rule_hits = [bool(f) and normalize_answer(f[0]) in g for f, g in zip(first, golds)]
    n = max(1, len(summaries))
    return {"episodes": len(summaries), **{k: counts.get(k, 0) for k in ANSWER_SOURCES},
            "opened_something": sum(bool(f) for f in first),
            "em": sum(float((s.get("metrics") or {}).get("em", 0.0)) for s in summaries) / n,
            "first_title_em": sum(rule_hits) / n}


ANSWER_SHARE_KEYS = tuple(f"answers_{source}" for source in ANSWER_SOURCES)  # the trainer's evaluation stats


def answer_shares(summaries: Sequence[dict]) -> dict[str, float]:
    """:data:`ANSWER_SHARE_KEYS`: the share of episodes whose answer came from each source (0 without episodes)."""
    sources = answer_sources(summaries)
    n = len(summaries)
    return {f"answers_{k}": (sources[k] / n if n else 0.0) for k in ANSWER_SOURCES}
