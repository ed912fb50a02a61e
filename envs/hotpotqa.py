"""HotpotQA (distractor setting) for training: a fixed held-out rule, the corpus, the prepared files.

- **Questions**: any HotpotQA-format source :func:`envs.data.load_qa` reads: FlashRAG-style JSONL
  (``id, question, golden_answers, supporting_titles, contexts [{title, text}]``), the original
  HotpotQA JSON array (``_id, question, answer, supporting_facts [[title, sent]], context [[title,
  [sentences]]]``) or the hub's ``hotpot_qa:distractor``. Every question needs its context
  paragraphs and its supporting-fact titles: those titles (the bridge document included, as the
  dataset labels it) are the question's positives (``QAExample.positive_titles``).
- **Split** (:func:`split_questions`): a question is HELD OUT when
  ``int(sha256(id as UTF-8).hexdigest(), 16) % 8 == 0``, else it is a training question. A pure
  function of the id: the same on every machine, in every file order and in every file holding
  the question (the original JSON's ``_id`` is the JSONL's ``id``). A training question whose
  normalised text repeats a held-out question's is left out of training (counted, never silent).
  On ``hotpotqa_dev_distractor_500.jsonl``: 445 training and 55 held-out questions.
- **Corpus** (:func:`envs.data.contexts_corpus`): every question's own paragraphs, training and
  held-out, one passage per paragraph, deduplicated on (title, text): 4,948 passages for the
  500-question file.

:func:`prepare_hotpotqa` writes ``train.jsonl``, ``held_out.jsonl``, ``corpus.jsonl`` and
``split.json`` into one folder; ``scripts/prepare_hotpotqa.py`` also builds the index, and
``configs/ppo/hotpotqa.yaml`` trains on them.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.atomic import write_text_atomic
from envs.data import DataFormatError, contexts_corpus, load_qa, write_flashrag_jsonl
from envs.metrics import normalize_answer
from envs.types import QAExample

__all__ = ["HELD_OUT_MODULUS", "HotpotSplit", "MissingPositivesWarning", "SPLIT_RULE", "held_out_bucket", "is_held_out",
           "load_hotpotqa", "prepare_hotpotqa", "split_questions"]

HELD_OUT_MODULUS = 8
SPLIT_RULE = "held out iff int(sha256(question id, UTF-8).hexdigest(), 16) % 8 == 0"
TRAIN_FILE, HELD_OUT_FILE, CORPUS_FILE, SUMMARY_FILE = "train.jsonl", "held_out.jsonl", "corpus.jsonl", "split.json"
CORPUS_ID_PREFIX = "hotpot_p"


class MissingPositivesWarning(UserWarning):
    """A supporting-fact title is not among the question's own context titles."""


def held_out_bucket(question_id: str, modulus: int = HELD_OUT_MODULUS) -> int:
    """``int(sha256(question_id).hexdigest(), 16) % modulus``: the id's bucket, 0 = held out."""
    return int(hashlib.sha256(str(question_id).encode("utf-8")).hexdigest(), 16) % modulus


def is_held_out(question_id: str, modulus: int = HELD_OUT_MODULUS) -> bool:
    """Whether the question with this id is held out (:data:`SPLIT_RULE`)."""
    return held_out_bucket(question_id, modulus) == 0


def record_locations(spec: str | os.PathLike, count: int) -> list[str]:
    """Where each of the ``count`` records :func:`load_qa` read from ``spec`` sits, for error
    messages: ``line N`` in a JSONL file (blank lines skipped as the loader skips them),
    ``item K`` (0-based) in a JSON array, ``row K`` of a hub dataset."""
    path = Path(spec).expanduser()
    if not path.is_file():
        return [f"row {k}" for k in range(count)]
    with open(path, encoding="utf-8") as handle:
        head = handle.read(64).lstrip()
    if path.suffix.lower() == ".json" and head.startswith("["):
        return [f"item {k}" for k in range(count)]
    lines: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if len(lines) == count:
                break
            if line.strip():
                lines.append(f"line {line_no}")
    return lines


def check_distractor_questions(examples: Sequence[QAExample], locations: Sequence[str], source: str) -> None:
    """Refuse questions the distractor recipe cannot use, naming ``source`` and the record: no
    context paragraphs, no supporting-fact titles, an id used twice. Warn (once, with a count and
    the first cases) about supporting titles missing from the question's own contexts: such a
    positive exists in the corpus only if another question brought that paragraph."""
    if not examples:
        raise DataFormatError(f"{source}: no questions")
    first_seen: dict[str, str] = {}
    missing: list[str] = []
    for example, where in zip(examples, locations):
        if not example.contexts:
            raise DataFormatError(f"{source}: {where}: question {example.id!r} has no context paragraphs "
                                  '("contexts" [{title, text}] or HotpotQA "context" [[title, [sentences]]])')
        if not example.positive_titles:
            raise DataFormatError(f"{source}: {where}: question {example.id!r} has no supporting-fact titles "
                                  '("supporting_titles" or HotpotQA "supporting_facts" [[title, sentence]])')
        if example.id in first_seen:
            raise DataFormatError(f"{source}: {where}: question id {example.id!r} was already used at "
                                  f"{first_seen[example.id]}; the held-out split is keyed by id, so ids must be unique")
        first_seen[example.id] = where
        titles = {c.get("title", "") for c in example.contexts}
        missing += [f"{where} ({t!r})" for t in example.positive_titles if t not in titles]
    if missing:
        warnings.warn(f"{source}: {len(missing)} supporting title(s) are not among their question's own context "
                      f"titles, e.g. {', '.join(missing[:3])}; they count as positives only where the corpus has "
                      "them", MissingPositivesWarning, stacklevel=2)


def load_hotpotqa(spec: str | os.PathLike, split: str = "train") -> list[QAExample]:
    """HotpotQA questions from a local file or hub dataset (``split`` for the hub only), checked
    by :func:`check_distractor_questions`. Malformed lines fail in :func:`load_qa`, with the file
    and line."""
    examples = load_qa(spec, split=split)
    check_distractor_questions(examples, record_locations(spec, len(examples)), str(spec))
    return examples


@dataclass(frozen=True)
class HotpotSplit:
    """Training and held-out questions, and the training questions left out as repeats."""

    train: list[QAExample]
    held_out: list[QAExample]
    repeats_dropped: int  # training questions whose normalised text is a held-out question's


def _drop_repeats(train: list[QAExample], held_out: list[QAExample]) -> tuple[list[QAExample], int]:
    """``train`` without the questions whose id or normalised text is a held-out question's."""
    ids = {e.id for e in held_out}
    texts = {normalize_answer(e.question) for e in held_out}
    kept = [e for e in train if e.id not in ids and normalize_answer(e.question) not in texts]
    return kept, len(train) - len(kept)


def split_questions(examples: Sequence[QAExample], modulus: int = HELD_OUT_MODULUS) -> HotpotSplit:
    """Split one file's questions by :data:`SPLIT_RULE` (``modulus`` 8), file order kept on both sides."""
    if modulus < 2:
        raise ValueError(f"modulus must be at least 2, not {modulus}")
    held_out = [e for e in examples if is_held_out(e.id, modulus)]
    train, dropped = _drop_repeats([e for e in examples if not is_held_out(e.id, modulus)], held_out)
    return HotpotSplit(train=train, held_out=held_out, repeats_dropped=dropped)


def prepare_hotpotqa(source: str | os.PathLike, out_dir: str | os.PathLike, eval_source: str | None = None,
                     split: str = "train", eval_split: str = "validation",
                     modulus: int = HELD_OUT_MODULUS) -> dict:
    """Write ``train.jsonl``, ``held_out.jsonl``, ``corpus.jsonl`` and ``split.json`` to ``out_dir``.

    Without ``eval_source`` both question sets come from ``source`` by :func:`split_questions`.
    With it, every question of ``source`` trains (less any that repeats an ``eval_source`` question)
    and ``eval_source`` is held out whole. The corpus is the union of both sets' paragraphs.
    Returns the summary written to ``split.json``.
    """
    out = Path(out_dir)
    examples = load_hotpotqa(source, split=split)
    if eval_source is None:
        parts, rule = split_questions(examples, modulus), SPLIT_RULE.replace("% 8", f"% {modulus}")
    else:
        held_out = load_hotpotqa(eval_source, split=eval_split)
        train, dropped = _drop_repeats(examples, held_out)
        parts, rule = HotpotSplit(train, held_out, dropped), f"held out: every question of {eval_source}"
    if not parts.train or not parts.held_out:
        raise DataFormatError(f"{source}: the split leaves {len(parts.train)} training and {len(parts.held_out)} "
                              "held-out questions; both must be non-empty")
    write_flashrag_jsonl(parts.train, out / TRAIN_FILE)
    write_flashrag_jsonl(parts.held_out, out / HELD_OUT_FILE)
    passages = contexts_corpus([*parts.train, *parts.held_out], out / CORPUS_FILE, id_prefix=CORPUS_ID_PREFIX)
    summary = {"source": str(source), "eval_source": eval_source, "rule": rule, "questions": len(examples),
               "train": len(parts.train), "held_out": len(parts.held_out),
               "repeats_dropped_from_train": parts.repeats_dropped, "passages": passages,
               "paragraphs": sum(len(e.contexts) for e in (*parts.train, *parts.held_out))}
    write_text_atomic(json.dumps(summary, indent=2) + "\n", out / SUMMARY_FILE)
    return summary
