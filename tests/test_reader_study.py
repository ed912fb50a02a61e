"""Where the answer term goes (training/studies/reader_study.py): answers classified against what the
episode opened and showed, and the scripted reader rules' table on the conftest toy retriever."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import OverlapRetriever

from envs.config import EnvConfig
from envs.protocol import ALONE_FORM
from envs.types import QAExample
from tests.tiny_models import tiny_tokenizer
from training.evaluation.answer_sources import (
    ANSWER_SHARE_KEYS,
    ANSWER_SOURCES,
    answer_shares,
    answer_source,
    answer_sources,
    copies_question,
)
from training.studies.reader_study import answer_context, forced_answers, teacher_table
from training.teachers.scripted_teacher import ScriptedTeacherConfig, collect_scripted
from training.teachers.trajectories import tokenize_trajectory

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


class RuleModel(torch.nn.Module):
    """A stand-in policy whose greedy answer turn follows a rule over the decoded context:
    ``"first_opened"`` answers the first title of the last <information>, ``"first_shown"`` the
    first title of the last <snapshot>."""

    def __init__(self, tokenizer, rule: str):
        super().__init__()
        self.tokenizer, self.rule, self.weight = tokenizer, rule, torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, attention_mask, max_new_tokens, **_):
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            context = self.tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
            block = context.rsplit("<information>" if self.rule == "first_opened" else "<snapshot>", 1)[1]
            title = re.search(r"\[\d+\] ([^\n:]+)", block).group(1).strip()
            turn = self.tokenizer(f"<answer>{title}</answer>", add_special_tokens=False)["input_ids"]
            rows.append(ids + turn[:max_new_tokens])
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.tokenizer.eos_token_id] * (width - len(r)) for r in rows])


@pytest.fixture
def teacher_records(retriever):
    questions = [QAExample(f"f{k}", q, (gold,)) for k, (q, gold) in enumerate([
        ("What is the capital of France?", "Paris"), ("Which river flows through Berlin?", "Spree"),
        ("What is the capital of Japan?", "Tokyo"), ("Which river flows through Vienna?", "Danube")])]
    config = EnvConfig(expand_form="judge", judge_context="alone", max_expand=5, max_actions=3, max_searches=1)
    settings = ScriptedTeacherConfig(open_rate=1.0, second_search=False, think=False)
    return collect_scripted(questions, retriever, config, settings, num_envs=2, seed=0, samples=2)


def test_answer_context_is_the_trajectory_up_to_its_answer(teacher_records):
    tokenizer = tiny_tokenizer()
    for record in teacher_records:
        whole = tokenize_trajectory(record, tokenizer, ALONE_FORM, train_verdicts=False)
        context = answer_context(record, tokenizer, ALONE_FORM)
        answer = tokenizer(record["segments"][-1]["text"], add_special_tokens=False)["input_ids"]
        assert whole["input_ids"] == context + answer + [tokenizer.eos_token_id]
        assert whole["loss_mask"][len(context):] == [1] * (len(answer) + 1)
    with pytest.raises(ValueError, match="does not end with an answer"):
        answer_context({**teacher_records[0], "segments": teacher_records[0]["segments"][:-1]}, tokenizer, ALONE_FORM)


def test_forced_answers_tell_a_reader_from_a_policy_that_answers_the_snapshot(teacher_records):
    """Teacher forcing up to the answer: a model that reads (first opened title) says what the
    teacher said on every trajectory; one that answers the first SHOWN title is caught out on the
    trajectories whose first candidate the teacher did not open."""
    tokenizer = tiny_tokenizer()
    records = [dict(r, summary=dict(r["summary"])) for r in teacher_records]
    for record in records[::2]:  # the teacher opened from candidate 2 on: the first shown is not opened
        search = record["summary"]["searches"][0]
        record["summary"]["searches"] = [{**search, "expanded": [n for n in search["expanded"] if n != 1]}]
        verdicts = " ".join(f"[{i}] {'no' if i == 1 else 'yes'}" for i in range(1, len(search["ids"]) + 1))
        opened = [(n, search["titles"][n - 1]) for n in record["summary"]["searches"][0]["expanded"]]
        segments = record["segments"]
        segments[3] = {"role": "model", "text": f"<expand>{verdicts}</expand>"}
        segments[4] = {"role": "observation", "text": "<information>\n" + "\n\n".join(
            f"[{n}] {title}\ntext of {title}" for n, title in opened) + "\n</information>"}
        segments[5] = {"role": "model", "text": f"<answer>{opened[0][1]}</answer>"}
        record["summary"]["answer"] = opened[0][1]
    reader = forced_answers(RuleModel(tokenizer, "first_opened"), tokenizer, records, ALONE_FORM)
    assert reader["episodes"] == len(records) == 8
    assert reader["teacher_answer"] == reader["first_opened"] == 8
    skimmer = forced_answers(RuleModel(tokenizer, "first_shown"), tokenizer, records, ALONE_FORM)
    assert skimmer["teacher_answer"] == skimmer["first_opened"] == 4
    assert skimmer["shown_not_opened"] == 4
