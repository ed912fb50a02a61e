"""The selection-profile targets (training.evaluation.selection_profile): a policy that raises the reward by
opening nothing must FAIL them, and one that opens what it should must pass, on real env episodes
of the learning test's box world (the scripted teacher plays them; no model needed)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from envs.config import EnvConfig
from scripts.box_world import ENV, BoxRetriever, world
from training.evaluation.policy_eval import compare_runs, question_outcomes
from training.evaluation.selection_profile import SelectionTargets, selection_misses, selection_verdict
from training.teachers.scripted_teacher import ScriptedTeacherConfig, collect_scripted

# the box world with an empty box costing twice as much: opening two boxes at random scores below
# opening none, so a policy that stops reading RAISES the reward
COSTLY_EMPTIES = {**ENV, "reward": {**ENV["reward"], "negative_opened_penalty": 0.5}}
# one box of five holds something: reading about two documents is not this world's profile
BOX_TARGETS = SelectionTargets(docs_read=(0.5, 3.0))


@pytest.fixture(scope="module")
def box():
    passages, questions = world()
    return BoxRetriever(passages), questions[:48]


def outcomes_of(box, **teacher) -> dict:
    retriever, questions = box
    settings = ScriptedTeacherConfig(think=False, second_search=False, **teacher)
    records = collect_scripted(questions, retriever, EnvConfig.from_dict(COSTLY_EMPTIES), settings)
    return question_outcomes([SimpleNamespace(reward=r["summary"]["reward"]["total"], info=r["summary"])
                              for r in records])


def test_a_policy_that_stops_opening_raises_the_reward_and_fails_the_profile(box):
    random_two = outcomes_of(box, random_expand=2)
    opens_none = outcomes_of(box, random_expand=0)
    comparison = compare_runs(random_two, opens_none, resamples=500)
    assert comparison["reward"]["diff"] > 0.3 and comparison["reward"]["lo"] > 0  # the reward rose, surely
    assert comparison["recall"]["after"] == 0.0 and comparison["docs"]["after"] == 0.0
    misses = selection_misses(comparison, BOX_TARGETS)
    assert any(m.startswith("recall after") for m in misses)
    assert any(m.startswith("recall fell") for m in misses)
    assert any(m.startswith("selection F1") for m in misses)
    assert any(m.startswith("documents read") for m in misses)
    assert selection_verdict(comparison, BOX_TARGETS).startswith("selection profile: misses")


def test_a_policy_that_opens_what_it_should_meets_the_profile(box):
    random_two = outcomes_of(box, random_expand=2)
    positives = outcomes_of(box, expand="positives")  # gold-guided: the one full box of each search
    comparison = compare_runs(random_two, positives, resamples=500)
    assert comparison["recall"]["after"] == 1.0 and comparison["precision"]["after"] == 1.0
    assert selection_misses(comparison, BOX_TARGETS) == []
    assert selection_verdict(comparison, BOX_TARGETS).startswith("selection profile: meets")


def row(before: float, after: float, lo: float | None = None, hi: float | None = None) -> dict:
    diff = after - before
    return {"before": before, "after": after, "diff": diff, "lo": diff if lo is None else lo,
            "hi": diff if hi is None else hi}


def test_each_target_is_checked_at_its_edge():
    met = {"recall": row(0.72, 0.70), "precision": row(0.15, 0.25, lo=0.01), "f1": row(0.25, 0.37, lo=0.01),
           "docs": row(3.2, 3.0), "em": row(0.05, 0.05, lo=-0.02), "copy": row(0.05, 0.05)}
    assert selection_misses(met) == []
    edges = {"recall": row(0.76, 0.70), "precision": row(0.15, 0.2499, lo=0.01), "f1": row(0.25, 0.37, lo=0.0),
             "docs": row(3.2, 3.01), "em": row(0.05, 0.05, lo=-0.021), "copy": row(0.051, 0.0)}
    for name, broken in edges.items():
        assert len(selection_misses({**met, name: broken})) == 1, name
    assert selection_misses({k: v for k, v in met.items() if k != "copy"}) == ["copy: not recorded in this comparison"]
