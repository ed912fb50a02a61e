"""The trainer's evaluation records two of the reward's parts per question (the selection term and
the format penalties, as the env broke the reward down) and compares them before and after PPO."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.rewards import RewardConfig
from envs.search_env import SearchEnv
from training.evaluation.policy_eval import CORE_OUTCOME_KEYS, compare_runs, question_outcomes, statistics_of


def episode(reward: float, em: float, selection: float | None, format_: float = 0.0) -> SimpleNamespace:
    info = {"metrics": {"em": em}, "positives_opened": 1, "docs_read": 2, "positives_shown": 2}
    if selection is not None:
        info["reward"] = {"answer": em, "selection": selection, "format": format_, "total": reward}
    return SimpleNamespace(reward=reward, info=info)


def test_each_question_records_the_selection_and_format_parts():
    outcomes = question_outcomes([episode(1.15, 1.0, 0.25, -0.1), episode(-0.05, 0.0, -0.05),
                                  episode(-0.3, 0.0, None)])  # ended by the rollout before the env scored it
    assert outcomes["selection_reward"].tolist() == [0.25, -0.05, 0.0]
    assert outcomes["format_reward"].tolist() == [-0.1, 0.0, 0.0]


def test_comparisons_have_the_parts_only_where_both_sides_recorded_them():
    before = question_outcomes([episode(0.0, 0.0, 0.0), episode(-0.1, 0.0, -0.1)])
    after = question_outcomes([episode(0.25, 0.0, 0.25), episode(1.0, 1.0, 0.0)])
    rows = compare_runs(before, after, resamples=200)
    assert set(rows) == {"reward", "em", "precision", "recall", "f1", "docs", "selection", "format", "reading", "copy"}
    assert rows["selection"]["diff"] == pytest.approx(0.175) and rows["format"]["diff"] == 0.0
    assert rows["reward"]["diff"] == pytest.approx(rows["em"]["diff"] + rows["selection"]["diff"])
    old = {k: before[k] for k in CORE_OUTCOME_KEYS}  # an eval.json written before the parts were
    assert set(compare_runs(old, after, resamples=200)) == {"reward", "em", "precision", "docs"}
    assert statistics_of(old, after) == ["reward", "em", "precision", "docs"]


def selected(opened: int, positives_opened: int, shown: int) -> SimpleNamespace:
    info = {"metrics": {"em": 0.0}, "docs_read": opened, "positives_opened": positives_opened,
            "positives_shown": shown}
    return SimpleNamespace(reward=0.0, info=info)


def test_recall_shows_what_a_precision_gain_by_opening_less_costs():
    """Opening only the surest candidate raises precision and lowers recall; both pooled over questions."""
    before = question_outcomes([selected(4, 1, 1), selected(4, 2, 2), selected(3, 0, 1), selected(0, 0, 0)])
    after = question_outcomes([selected(1, 1, 1), selected(0, 0, 2), selected(0, 0, 1), selected(0, 0, 0)])
    rows = compare_runs(before, after, resamples=200)
    assert (rows["precision"]["before"], rows["precision"]["after"]) == (pytest.approx(3 / 11), 1.0)
    assert (rows["recall"]["before"], rows["recall"]["after"]) == (pytest.approx(3 / 4), pytest.approx(1 / 4))
    assert rows["recall"]["diff"] == pytest.approx(-0.5) and rows["recall"]["hi"] <= 0
    nothing_shown = question_outcomes([selected(2, 0, 0)])
    assert compare_runs(nothing_shown, nothing_shown, resamples=50)["recall"]["before"] == 0.0


def test_selection_f1_pools_hits_over_selected_and_relevant_and_docs_is_the_mean_read():
    """F1 = 2·Σpositives opened / (Σdocuments read + Σpositives shown), the harmonic mean of the pooled
    precision and recall; a policy that stops opening scores 0, however high its precision was."""
    before = question_outcomes([selected(4, 1, 1), selected(4, 2, 2), selected(3, 0, 1), selected(0, 0, 0)])
    after = question_outcomes([selected(1, 1, 1), selected(0, 0, 2), selected(0, 0, 1), selected(0, 0, 0)])
    rows = compare_runs(before, after, resamples=200)
    assert rows["f1"]["before"] == pytest.approx(2 * 3 / (11 + 4))  # P 3/11, R 3/4: 2PR/(P+R) = 0.4
    assert rows["f1"]["after"] == pytest.approx(2 * 1 / (1 + 4))
    assert (rows["docs"]["before"], rows["docs"]["after"]) == (pytest.approx(11 / 4), pytest.approx(1 / 4))
    closed = question_outcomes([selected(0, 0, 1), selected(0, 0, 2)])
    assert compare_runs(closed, closed, resamples=50)["f1"]["after"] == 0.0


def test_copy_is_the_share_of_answers_made_of_the_questions_words():
    question = "Which river flows through the city of Berlin?"
    copies = [SimpleNamespace(reward=0.0, info={"answer": a, "question": question, "metrics": {"em": 0.0}})
              for a in ("river flows through the city of Berlin", "Spree", None, "Which river flows through Berlin")]
    outcomes = question_outcomes(copies)
    assert outcomes["copied_question"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert compare_runs(outcomes, outcomes, resamples=50)["copy"]["before"] == pytest.approx(0.5)


def read(answer: str | None, opened: tuple[int, ...]) -> SimpleNamespace:
    info = {"answer": answer, "metrics": {"em": 0.0}, "question": "Which river flows through Berlin?",
            "searches": [{"titles": ["Berlin", "Spree", "Danube"], "expanded": list(opened)}]}
    return SimpleNamespace(reward=0.0, info=info)


def test_reading_is_the_share_of_questions_that_opened_something_answered_from_the_first_title():
    """Opening less must not read as answering worse: the statistic counts only the questions that
    opened something, and a question that opened nothing adds to neither side of the ratio."""
    before = question_outcomes([read("Spree", (2, 1)), read("Berlin", (2,)), read("Danube", ()), read(None, (1,))])
    assert before["opened_any"].tolist() == [1, 1, 0, 1]
    assert before["answered_first_opened"].tolist() == [1, 0, 0, 0]  # 2nd: shown, not opened; 4th: no answer
    after = question_outcomes([read("Spree", (2,)), read("Berlin", ()), read("Danube", ()), read("Berlin", (1,))])
    row = compare_runs(before, after, resamples=200)["reading"]
    assert (row["before"], row["after"]) == (pytest.approx(1 / 3), 1.0)  # 1 of 3 opened; 2 of 2 opened
    assert compare_runs(before, after, resamples=200)["precision"]["after"] == 0.0  # no positives recorded


def test_the_env_reward_is_the_sum_of_its_parts(retriever, examples):
    config = EnvConfig(max_actions=5, max_searches=1, reward=RewardConfig(positive_opened_bonus=0.25))
    env = SearchEnv(retriever, examples, config)
    env.reset(seed=0, options={"example": examples[0]})
    total = 0.0
    for action in ("<search>capital of France Paris river</search>", "<bogus>", "<expand>1, 2</expand>",
                   "<answer>Paris</answer>"):
        _, reward, terminated, _, info = env.step(action)
        total += reward
    assert terminated
    summary = info["episode"]  # what the rollout keeps as the episode's info
    parts = summary["reward"]
    assert parts["format"] < 0 and parts["answer"] == 1.0
    assert total == pytest.approx(parts["answer"] + parts["selection"] + parts["format"])
    outcomes = question_outcomes([SimpleNamespace(reward=total, info=summary)])
    assert np.allclose(outcomes["reward"], outcomes["em"] + outcomes["selection_reward"] + outcomes["format_reward"])
