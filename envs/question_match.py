"""Records paired by question id must name the same question.

Resuming a run, ``--compare``, the viewer, the shards of a data-parallel run and
``training.seed_spread`` pair results by question id. An id is only a name: a question file that
changed, or ids that were positions in a different draw, can put another question behind the same
id. These helpers compare a digest of the question text behind each shared id and refuse a
mismatch, naming the ids.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

SHOWN_IDS = 5  # ids named in the error (the count says how many there are)


class QuestionMismatchError(ValueError):
    """The same question id names different questions in two sources."""


def question_digest(text: str) -> str:
    """A short digest of a question's text (the text exactly as stored)."""
    return hashlib.sha256(str(text).encode("utf-8")).hexdigest()[:16]


def record_digests(records: Iterable[Mapping]) -> dict[str, str]:
    """``{id: digest of its question}`` of records holding an ``id`` and a ``question`` text (or a
    ``question_digest``); records without either are left out (nothing to check)."""
    digests: dict[str, str] = {}
    for record in records:
        if not isinstance(record, Mapping) or "id" not in record:
            continue
        if isinstance(record.get("question_digest"), str):
            digests.setdefault(str(record["id"]), record["question_digest"])
        elif isinstance(record.get("question"), str):
            digests.setdefault(str(record["id"]), question_digest(record["question"]))
    return digests


def mismatched_ids(left: Mapping[str, str], right: Mapping[str, str]) -> list[str]:
    """The ids both mappings hold whose digests differ, in ``left``'s order."""
    return [i for i, digest in left.items() if i in right and right[i] != digest]


def check_same_questions(left: Mapping[str, str], right: Mapping[str, str], left_name: str,
                         right_name: str) -> None:
    """Raise :class:`QuestionMismatchError` when an id both hold names different questions.

    ``left``, ``right``: ``{id: question digest}`` (:func:`record_digests`, :func:`question_digest`).
    """
    bad = mismatched_ids(left, right)
    if bad:
        shown = ", ".join(repr(i) for i in bad[:SHOWN_IDS]) + (" ..." if len(bad) > SHOWN_IDS else "")
        raise QuestionMismatchError(
            f"{len(bad)} question id(s) name different questions in {left_name} and {right_name}: {shown} "
            f"(the question text behind the id differs; results paired by id would mix questions)")
