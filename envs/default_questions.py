"""Questions generated from the embedded default corpus, deterministic for a seed.

Two kinds, both answered by an article title:

- ``single``: identify an article from its short description and the first sentence of its
  summary, with the words of its title masked as ``___``. Positive: the article's first passage.
- ``bridge`` (two hops): article A's passage mentions article B. The question describes A by
  its masked first sentence and B by its description; the answer is B's title. Positives: the
  passages of A (first and mentioning) and B's first passage.

The answer never appears in the question: title words are masked, and any candidate whose
normalised question still contains a normalised gold answer is dropped.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import string
from collections import defaultdict

from envs.retrieval.default_corpus import default_articles_path, default_corpus_path, read_articles, split_sentences
from envs.types import QAExample

DATASET = "seeds-default"
MASK = "___"
CLUE_WORDS = 45  # a clue sentence longer than this is cut with an ellipsis
MIN_CLUE_WORDS = 5  # unmasked words a clue must keep to be answerable
MAX_BRIDGES_PER_ANSWER = 3  # keeps frequent bridge answers ("United States") from dominating
_STOPWORDS = {"a", "an", "the", "of", "and", "in", "on", "for", "to", "at", "by", "de", "la", "le", "or"}
_KINDS = {"People": "person", "Geography": "place"}
_WORD = re.compile(r"[^\W_]+(?:['\u2019.-][^\W_]+)*")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Capitalised words that may stand just before a multi-word title ("In the United States").
_LOWER_OK = {"In", "The", "A", "An", "By", "From", "At", "On", "Of", "For", "And", "With", "To"}


def _normalize(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(w for w in text.split() if w not in {"a", "an", "the"})


def aliases(title: str) -> list[str]:
    """Gold answers for a title: the title itself and the title without a parenthetical suffix."""
    names = [title]
    short = re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()
    if short and short != title:
        names.append(short)
    return names


def _title_words(titles: list[str]) -> set[str]:
    words: set[str] = set()
    for title in titles:
        words.update(w.lower() for w in _WORD.findall(title) if w.lower() not in _STOPWORDS)
    return words


def _same_stem(word: str, title_word: str) -> bool:
    """True for the title word itself and its near forms ("rabbits", "Chinese", "Eukaryota")."""
    if word == title_word:
        return True
    if len(title_word) < 4 or len(word) < len(title_word) - 2:
        return False
    common = len(os.path.commonprefix([word, title_word]))
    return common >= max(4, len(title_word) - 2)


def mask_titles(text: str, titles: list[str]) -> str:
    """Replace every word of ``titles`` and its near forms (case-insensitive) with ``___``.

    Stopwords ("of", "the") stay; runs of masks collapse into one ``___``.
    """
    hidden = _title_words(titles)
    prefixes = {t[:4] for t in hidden}

    def hide(match: re.Match) -> str:
        word = match.group(0).lower()
        if word in hidden or (word[:4] in prefixes and any(_same_stem(word, t) for t in hidden)):
            return MASK
        return match.group(0)

    masked = _WORD.sub(hide, text)
    return re.sub(rf"{MASK}(?:[\s-]+{MASK})+", MASK, masked)


def _cut(sentence: str, max_words: int = CLUE_WORDS) -> str:
    words = sentence.split()
    return sentence if len(words) <= max_words else " ".join(words[:max_words]) + " ..."


def _kind(article: dict) -> str:
    return _KINDS.get(article.get("topic", ""), "subject")


def _visible_words(clue: str) -> int:
    return sum(1 for w in clue.split() if MASK not in w and any(ch.isalnum() for ch in w))


def _leaks(question: str, answers: list[str]) -> bool:
    norm = f" {_normalize(question)} "
    return any(_normalize(a) and f" {_normalize(a)} " in norm for a in answers)


def _load_passages(corpus_path) -> dict[str, str]:
    with open(corpus_path, encoding="utf-8") as handle:
        records = (json.loads(line) for line in handle if line.strip())
        return {r["id"]: r["text"] for r in records}


def _single(article: dict, texts: dict[str, str]) -> dict | None:
    first = article["passage_ids"][0]
    answers = aliases(article["title"])
    clue = mask_titles(_cut(split_sentences(texts[first])[0]), answers)
    description = mask_titles(article.get("description", ""), answers)
    if _visible_words(clue) < MIN_CLUE_WORDS:
        return None
    if not _visible_words(description):
        description = ""
    described = f' is described as "{description}" and' if description else ""
    question = f'Which {_kind(article)}{described} has a summary that begins: "{clue}"?'
    if _leaks(question, answers):
        return None
    return {"kind": "single", "question": question, "answers": answers,
            "positive_ids": [first], "titles": [article["title"]], "topic": article.get("topic", "")}


def _bare(word: str) -> str:
    """A word without trailing punctuation or a possessive ``'s``."""
    word = word.rstrip(",.;:!?)\"'\u2019\u201d")
    for suffix in ("'s", "\u2019s"):
        word = word.removesuffix(suffix)
    return word


def _is_mention(words: list[str], pos: int, tokens: list[str]) -> bool:
    """Whether the title ``tokens`` stand, as a whole name, at ``words[pos]``."""
    span = words[pos : pos + len(tokens)]
    if len(span) < len(tokens) or span[:-1] != tokens[:-1] or _bare(span[-1]) != _bare(tokens[-1]):
        return False
    before = words[pos - 1] if pos else ""
    if len(tokens) == 1 and (not before or before[-1] in ".!?"):
        return False  # a one-word title opening a sentence is just a capitalised word
    if before[:1].isupper() and (len(tokens) == 1 or before not in _LOWER_OK):
        return False  # part of a longer name
    after = words[pos + len(tokens)] if pos + len(tokens) < len(words) else ""
    return not (after[:1].isupper() and span[-1] == tokens[-1])


def _is_common_noun(article: dict, texts: dict[str, str]) -> bool:
    """True if the article's own text uses its title in lower case ("A house is ...")."""
    own = " ".join(texts[pid] for pid in article["passage_ids"])
    return re.search(rf"\b{re.escape(article['title'].lower())}\b", own) is not None


def _start_key(tokens: list[str]) -> tuple[str, ...]:
    """Lookup key of a title: its first word, plus the second word for multi-word titles."""
    if len(tokens) == 1:
        return (_bare(tokens[0]),)
    return (tokens[0], _bare(tokens[1]) if len(tokens) == 2 else tokens[1])


def _mention_finder(articles: list[dict], texts: dict[str, str]):
    """Return ``find(text) -> set of article indices whose title occurs in text``.

    Titles match case-sensitively on whole words and must not be part of a longer capitalised
    name ("Spartacus" in "Spartacus League" does not count); a one-word title must not start a
    sentence, so "Water" opening a sentence is no mention. Titles with a parenthetical qualifier
    are ambiguous in running text and are skipped, and so are common nouns (see
    :func:`_is_common_noun`): "the House of Atreus" is no mention of the article "House".
    """
    by_start = defaultdict(list)  # (first word,) or (first word, second word) -> titles
    for index, article in enumerate(articles):
        title = article["title"]
        if "(" in title or len(title) < 4 or not title[0].isupper() or _is_common_noun(article, texts):
            continue
        tokens = title.split()
        by_start[_start_key(tokens)].append((tokens, index))

    def find(text: str) -> set[int]:
        words = text.split()
        bare = [_bare(w) for w in words] + [""]
        found = set()
        for pos, word in enumerate(words):
            following = words[pos + 1] if pos + 1 < len(words) else ""
            for key in {(bare[pos],), (word, bare[pos + 1]), (word, following)}:
                for tokens, index in by_start.get(key, ()):
                    if _is_mention(words, pos, tokens):
                        found.add(index)
        return found

    return find


def _bridge(a: dict, b: dict, mention_id: str, texts: dict[str, str]) -> dict | None:
    answers = aliases(b["title"])
    if _normalize(answers[-1]) in _normalize(a["title"]) or not b.get("description"):
        return None
    first = a["passage_ids"][0]
    clue = mask_titles(_cut(split_sentences(texts[first])[0]), aliases(a["title"]) + answers)
    description = mask_titles(b["description"], answers)
    if _visible_words(clue) < MIN_CLUE_WORDS or not _visible_words(description):
        return None
    kind_b = _kind(b)
    question = (f'The {_kind(a)} whose summary begins "{clue}" mentions a {kind_b} described as '
                f'"{description}". Which {kind_b} is it?')
    if _leaks(question, answers):
        return None
    positives = list(dict.fromkeys([first, mention_id, b["passage_ids"][0]]))
    return {"kind": "bridge", "question": question, "answers": answers, "positive_ids": positives,
            "titles": [a["title"], b["title"]], "topic": b.get("topic", "")}


def _candidates(articles: list[dict], texts: dict[str, str]) -> tuple[list[dict], list[dict]]:
    singles = [q for q in (_single(a, texts) for a in articles) if q]
    find = _mention_finder(articles, texts)
    bridges: list[dict] = []
    per_answer: defaultdict[int, int] = defaultdict(int)
    for i, a in enumerate(articles):
        seen = {i}
        for pid in a["passage_ids"]:
            for j in sorted(find(texts[pid]) - seen):
                seen.add(j)
                q = per_answer[j] < MAX_BRIDGES_PER_ANSWER and _bridge(a, articles[j], pid, texts)
                if q:
                    per_answer[j] += 1
                    bridges.append(q)
    return _unique(singles), _unique(bridges)


def _unique(questions: list[dict]) -> list[dict]:
    """The first of any questions with the same text and answers (so ids are unique)."""
    unique: dict[str, dict] = {}
    for question in questions:
        unique.setdefault(question_id(question), question)
    return list(unique.values())


def question_id(question: dict) -> str:
    """A generated question's id: a digest of its text and answers, so it names the same question
    in every draw (any ``n``, any seed) that contains it."""
    text = question["question"] + "\n" + "\n".join(question["answers"])
    return "default-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _bridge_count(k: int, fraction: float, n_singles: int, n_bridges: int) -> int:
    """How many of the first ``k`` questions are bridges: non-decreasing in ``k``, by at most one."""
    return max(min(n_bridges, math.floor(k * fraction + 0.5)), k - n_singles)


def generate_default_questions(
    n: int, seed: int = 0, corpus_path: str | os.PathLike | None = None,
    meta_path: str | os.PathLike | None = None, two_hop_fraction: float = 0.5,
) -> list[QAExample]:
    """Generate ``n`` questions from the default corpus (or the given corpus/article files).

    About ``two_hop_fraction`` of them are bridge questions (fewer if the corpus has too few
    article pairs). The same ``seed`` and files always give the same questions, and the draw of
    ``n`` is the first ``n`` of any larger draw: each kind's candidates are shuffled once with
    ``seed`` and taken in that order, so extending a run keeps its questions. Ids do not depend on
    ``n`` or the position (:func:`question_id`).
    """
    if not 0.0 <= two_hop_fraction <= 1.0:
        raise ValueError(f"two_hop_fraction must be in [0, 1], not {two_hop_fraction}")
    corpus_path = corpus_path or default_corpus_path()
    articles = read_articles(meta_path or default_articles_path())
    singles, bridges = _candidates(articles, _load_passages(corpus_path))
    if n > len(singles) + len(bridges):
        raise ValueError(f"asked for {n} questions but the corpus supports only {len(singles) + len(bridges)}")
    rng = random.Random(seed)
    rng.shuffle(bridges)
    rng.shuffle(singles)
    chosen, taken = [], 0
    for k in range(1, n + 1):
        bridge_count = _bridge_count(k, two_hop_fraction, len(singles), len(bridges))
        chosen.append(bridges[taken] if bridge_count > taken else singles[k - 1 - taken])
        taken = bridge_count
    return [
        QAExample(
            id=question_id(q), question=q["question"], golden_answers=tuple(q["answers"]),
            positive_ids=tuple(q["positive_ids"]), positive_titles=tuple(q["titles"]),
            metadata={"dataset": DATASET, "type": q["kind"], "topic": q["topic"], "seed": seed},
        )
        for q in chosen
    ]
