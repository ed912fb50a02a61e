"""The text protocol between a policy and the environment.

Actions are ``<search>query</search>``, ``<expand>2, 5</expand>`` (1-based candidate numbers
from the latest snapshot, separated by commas or spaces, or ``none``) and
``<answer>text</answer>``. The first complete action tag in the model output is the action;
text before it (reasoning, ``<think>`` blocks) is allowed and ignored. Anything else parses
to an :class:`InvalidAction` carrying the reason, never an exception.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

ACTION_TAGS = ("search", "expand", "answer")
CLOSING_TAGS = tuple(f"</{tag}>" for tag in ACTION_TAGS)
_ACTION = re.compile(r"<(search|expand|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_ONLY = re.compile(r"<(search|expand|answer)>", re.IGNORECASE)
_ID_SEPARATORS = re.compile(r"[\s,;]+")


@dataclass(frozen=True)
class SearchAction:
    query: str


@dataclass(frozen=True)
class ExpandAction:
    ids: tuple[int, ...]  # 1-based candidate numbers, in the order given, without repeats


@dataclass(frozen=True)
class AnswerAction:
    answer: str


@dataclass(frozen=True)
class InvalidAction:
    reason: str
    raw: str


Action = Union[SearchAction, ExpandAction, AnswerAction, InvalidAction]


def _parse_ids(body: str, raw: str) -> Action:
    cleaned = body.strip().strip("[]").strip()
    if cleaned.lower() in {"none", "no", "nothing"}:
        return ExpandAction(ids=())
    if not cleaned:
        return InvalidAction("empty <expand>; give candidate numbers such as 1, 3 or the word none", raw)
    ids: list[int] = []
    for token in _ID_SEPARATORS.split(cleaned):
        token = token.strip("[]()#")
        if not token:
            continue
        if not token.isdigit():
            return InvalidAction(f"expand id {token!r} is not a candidate number", raw)
        value = int(token)
        if value not in ids:
            ids.append(value)
    return ExpandAction(ids=tuple(ids))


def parse_action(text: str) -> Action:
    """Parse one model turn into a typed action (or an invalid one with a reason)."""
    match = _ACTION.search(text)
    if match is None:
        opened = _OPEN_ONLY.search(text)
        if opened:
            return InvalidAction(f"<{opened.group(1).lower()}> is never closed", text)
        return InvalidAction("no <search>, <expand> or <answer> action found", text)
    tag, body = match.group(1).lower(), match.group(2)
    if tag == "search":
        query = " ".join(body.split())
        return SearchAction(query) if query else InvalidAction("empty <search> query", text)
    if tag == "expand":
        return _parse_ids(body, text)
    answer = " ".join(body.split())
    return AnswerAction(answer) if answer else InvalidAction("empty <answer>", text)


def format_search(query: str) -> str:
    return f"<search>{query}</search>"


def format_expand(ids: list[int] | tuple[int, ...]) -> str:
    return f"<expand>{', '.join(str(i) for i in ids) if ids else 'none'}</expand>"


def format_answer(answer: str) -> str:
    return f"<answer>{answer}</answer>"


def format_snapshot(body: str) -> str:
    """``<snapshot>`` observation around ``[i] Title: preview`` lines (see :func:`snapshot_lines`)."""
    return f"<snapshot>\n{body}\n</snapshot>"


def snapshot_lines(previews: list[str]) -> str:
    return "\n".join(f"[{i}] {p}" for i, p in enumerate(previews, start=1))


def format_passage(number: int, title: str, text: str) -> str:
    return f"[{number}] {title}\n{text}" if title else f"[{number}] {text}"


def format_information(body: str) -> str:
    return f"<information>\n{body}\n</information>"


def format_invalid(reason: str) -> str:
    """Observation for a bad action: what was wrong, so the policy can recover."""
    return format_information(f"Invalid action: {reason}.")
