"""Pull answers and structured fields out of free model text, tolerantly.

Small models ignore formats often; these helpers try the explicit forms first and fall back to
something sensible, and say which form they used so the trace can record it.
"""
from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_SO_ANSWER = re.compile(r"so the (?:final )?answer is[:\s]*(.+)", re.IGNORECASE | re.DOTALL)
_ANSWER_PREFIX = re.compile(r"^(?:final answer|answer)\s*[:\-]\s*", re.IGNORECASE)
_TAG = re.compile(r"<(search|expand|read|answer|think|information|snapshot)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)


_ANY_TAG = re.compile(r"</?[A-Za-z_]+>")


def clean_answer(text: str) -> str:
    """First line, without tags, an ``Answer:`` prefix, surrounding quotes or a final full stop."""
    text = _ANY_TAG.sub(" ", text)
    line = next((" ".join(ln.split()) for ln in text.strip().splitlines() if ln.strip()), "")
    line = _ANSWER_PREFIX.sub("", line).strip()
    line = line.strip("\"'*` ")
    if line.endswith(".") and not line.endswith(".."):
        line = line[:-1].strip("\"'*` ")
    return line


def extract_answer(text: str) -> tuple[str, str]:
    """``(answer, form)``: form is ``tag``, ``boxed``, ``so-the-answer-is``, ``line`` or ``none``."""
    tags = _ANSWER_TAG.findall(text)
    if tags and tags[-1].strip():
        return clean_answer(tags[-1]), "tag"
    boxed = _BOXED.findall(text)
    if boxed and boxed[-1].strip():
        return clean_answer(boxed[-1]), "boxed"
    match = _SO_ANSWER.search(text)
    if match and clean_answer(match.group(1)):
        return clean_answer(match.group(1)), "so-the-answer-is"
    without_tags = _TAG.sub(" ", text)
    answer = clean_answer(without_tags)
    return (answer, "line") if answer else ("", "none")


def last_tag(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>…</tag>`` in ``text``."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else None


def first_int(text: str) -> int | None:
    match = re.search(r"-?\d+", text)
    return int(match.group()) if match else None
