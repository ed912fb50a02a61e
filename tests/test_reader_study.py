"""Where the answer term goes (training/reader_study.py): answers classified against what the
episode opened and showed, and the scripted reader rules' table on the conftest toy retriever."""
from __future__ import annotations

from conftest import OverlapRetriever

from envs.config import EnvConfig
from envs.types import QAExample
from training.reader_study import (
    ANSWER_SHARE_KEYS,
    ANSWER_SOURCES,
    answer_shares,
    answer_source,
    answer_sources,
    copies_question,
    teacher_table,
)

QUESTION = 'Which subject is described as "River in Germany" and has a summary that begins: "The ___ flows"?'


def summary(answer, expanded=(2,), gold="Spree", titles=("Berlin", "Spree", "Danube")):
    return {"question": QUESTION, "golden_answers": [gold], "answer": answer,
            "metrics": {"em": float(answer == gold)},
            "searches": [{"titles": list(titles), "expanded": list(expanded)}]}


def test_each_answer_is_traced_to_what_the_episode_opened_or_saw():
    assert answer_source(summary("Spree")) == "first_opened"
    assert answer_source(summary("the spree.")) == "first_opened"  # compared normalised
    assert answer_source(summary("Danube", expanded=(2, 3))) == "other_opened"
    assert answer_source(summary("Berlin")) == "shown_not_opened"
    assert answer_source(summary('Which subject is described as "River in Germany"')) == "question_copy"
    assert answer_source(summary("It flows north into the Havel")) == "other"
    assert answer_source(summary(None)) == answer_source(summary("  ")) == "missing"
    assert copies_question("The ___ flows", QUESTION) is False  # too short to call a copy
    # Every search counts: a title opened in the second search is an opened title.
    two = summary("Vienna", expanded=())
    two["searches"].append({"titles": ["Vienna", "Austria"], "expanded": [1]})
    assert answer_source(two) == "first_opened"


def test_answer_sources_count_and_the_first_title_counterfactual():
    episodes = [summary("Spree"), summary("Berlin", expanded=(2,)), summary(QUESTION, expanded=(1,)),
                summary(None, expanded=())]
    sources = answer_sources(episodes)
    assert [sources[k] for k in ANSWER_SOURCES] == [1, 0, 1, 1, 1, 0]
    assert sources["episodes"] == 4 and sources["opened_something"] == 3
    assert sources["em"] == 0.25
    # Answering with the first title opened: Spree twice (episodes 1 and 2), Berlin once, nothing once.
    assert sources["first_title_em"] == 0.5


def test_answer_shares_are_the_evaluation_stats():
    shares = answer_shares([summary("Spree"), summary("Berlin"), summary("Spree"), summary(None)])
    assert list(shares) == list(ANSWER_SHARE_KEYS)
    assert shares["answers_first_opened"] == 0.5 and shares["answers_shown_not_opened"] == 0.25
    assert shares["answers_missing"] == 0.25 and sum(shares.values()) == 1.0
    assert set(answer_shares([]).values()) == {0.0}


def test_teacher_table_bounds_each_reader_rule():
    # The retriever ranks by shared words, stopwords included: a passage of nothing but the question's
    # stopwords comes first, so the first title is wrong while the passage closest in content is right.
    retriever = OverlapRetriever([("d1", "Alpha", "Which is it that it is in? It is the one of them."),
                                  ("g1", "Zorblax", "Zorblax is the glowing moss of the caves."),
                                  ("g2", "Quartz", "Quartz is a hard mineral of the caves of the north.")])
    examples = [QAExample("r1", "Which is it, the glowing moss of the caves, that it is in?", ("Zorblax",),
                          positive_ids=("g1",), metadata={"type": "single"}),
                QAExample("r2", "Which is it, the hard mineral of the north, that it is in?", ("Quartz",),
                          positive_ids=("g2",), metadata={"type": "bridge"})]
    table = teacher_table(examples, retriever, EnvConfig(max_actions=4, max_searches=1), seed=0)
    assert set(table) == {"positives (gold-guided)", "open_rate 0.5", "every candidate", "none"}
    assert set(table["none"]) == {"first_title", "overlap_title"}
    gold = table["positives (gold-guided)"]["first_title"]
    assert gold["em"] == 1.0 and gold["em_single"] == gold["em_bridge"] == 1.0 and gold["reward"] > 1.0
    assert table["none"]["first_title"]["em"] == table["none"]["overlap_title"]["em"] == 0.0
    assert table["every candidate"]["first_title"]["em"] == 0.0  # Alpha, shown first, opened first
    assert table["every candidate"]["overlap_title"]["em"] == 1.0
