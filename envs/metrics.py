"""Answer metrics, exactly as the field computes them.

``normalize_answer`` is the SQuAD v1.1 evaluation script's normalisation: lower-case, drop
ASCII punctuation, drop the articles a/an/the, collapse whitespace. Every metric takes the
best score over all gold answers.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = {"yes", "no", "noanswer"}


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower, remove punctuation, remove articles, fix whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_seek(text: str) -> str:
    """SEEK's normalisation (PAGER's evaluation code): as :func:`normalize_answer`, except that
    punctuation becomes a space instead of vanishing ("Notre-Dame" -> "notre dame", not "notredame")."""
    text = text.lower()
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# Cover-EM's normalisations by name: "squad" everywhere, "seek" where SEEK's numbers are reproduced.
COVER_EM_NORMALIZATIONS = {"squad": normalize_answer, "seek": normalize_seek}


def normalize_for_match(text: str) -> str:
    """SQuAD normalisation after stripping diacritics (the SEEDS answer-bearing proxy's text form)."""
    decomposed = unicodedata.normalize("NFD", text)
    return normalize_answer("".join(ch for ch in decomposed if not unicodedata.combining(ch)))


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _f1_pair(prediction: str, gold: str, hotpot_yes_no: bool) -> float:
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if hotpot_yes_no and (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: str | Sequence[str], hotpot_yes_no: bool = False) -> float:
    """Token-level F1 on normalised answers, best over golds.

    With ``hotpot_yes_no`` the HotpotQA rule applies: when either side normalises to
    yes/no/noanswer and the two differ, that gold scores 0.
    """
    return max((_f1_pair(prediction, g, hotpot_yes_no) for g in _golds(golds)), default=0.0)


def cover_em(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> float:
    """1.0 when, for some gold, every token of the normalised gold is a token of the prediction.
    ``normalization``: a name of :data:`COVER_EM_NORMALIZATIONS` (``"seek"``: punctuation to spaces)."""
    if normalization not in COVER_EM_NORMALIZATIONS:
        raise ValueError(f"cover_em normalization must be one of {tuple(COVER_EM_NORMALIZATIONS)}, "
                         f"not {normalization!r}")
    normalize = COVER_EM_NORMALIZATIONS[normalization]
    pred_tokens = set(normalize(prediction).split())
    for gold in _golds(golds):
        gold_tokens = normalize(gold).split()
        if gold_tokens and all(tok in pred_tokens for tok in gold_tokens):
            return 1.0
    return 0.0


def substring_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when some normalised gold is a character substring of the normalised prediction (FlashRAG ``acc``)."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in _golds(golds) if normalize_answer(g)))


def answer_bearing(passage_text: str, golds: str | Sequence[str]) -> bool:
    """SEEDS proxy: a normalised gold alias occurs in the normalised passage text (on word boundaries)."""
    text = f" {normalize_for_match(passage_text)} "
    return any(f" {g} " in text for g in (normalize_for_match(x) for x in _golds(golds)) if g)


def answer_scores(prediction: str | None, golds: Sequence[str]) -> dict[str, float]:
    """All answer metrics for one prediction; a missing prediction scores 0 everywhere."""
    if prediction is None:
        return {"em": 0.0, "f1": 0.0, "f1_hotpot": 0.0, "cover_em": 0.0, "acc": 0.0}
    return {
        "em": exact_match(prediction, golds),
        "f1": f1_score(prediction, golds),
        "f1_hotpot": f1_score(prediction, golds, hotpot_yes_no=True),
        "cover_em": cover_em(prediction, golds),
        "acc": substring_match(prediction, golds),
    }
