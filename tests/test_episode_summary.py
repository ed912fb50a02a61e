"""One episode summary for the env demo, training logs and evaluation runs (envs/report.py)."""
import pytest

from envs.report import summarize_episodes
from inference.run_metrics import summarize
from training.rollouts.rollout import Episode, rollout_stats


def env_summary(positives_opened, negatives_opened, positives_shown, docs_shown, em, reward, answer="x"):
    return {"metrics": {"em": em, "f1": em}, "reward": {"total": reward}, "answer": answer, "n_searches": 1,
            "n_actions": 3, "n_invalid": 0, "docs_read": positives_opened + negatives_opened, "doc_tokens": 10,
            "docs_shown": docs_shown, "positives_shown": positives_shown, "positives_opened": positives_opened,
            "negatives_opened": negatives_opened, "positives_missed": positives_shown - positives_opened}


SUMMARIES = [env_summary(1, 0, 1, 5, 1.0, 1.1), env_summary(1, 3, 2, 5, 0.0, -0.1, answer=None)]


def test_selection_figures_are_pooled_and_means_count_every_episode():
    out = summarize_episodes(SUMMARIES)
    assert out["precision"] == pytest.approx(2 / 5)  # pooled; per-episode mean would be 0.625
    assert out["recall"] == pytest.approx(2 / 3)
    assert out["fallout"] == pytest.approx(3 / 7)
    assert out["em"] == 0.5 and out["answered"] == 0.5 and out["reward_mean"] == pytest.approx(0.5)
    assert out["docs_read_per_question"] == 2.5 and out["positives_missed_per_question"] == 0.5
    # what the searches put in front of the policy: recall's denominator and the candidates, per question
    assert out["positives_shown_per_question"] == 1.5 and out["docs_shown_per_question"] == 5.0


def test_opening_nothing_has_precision_zero_and_missing_keys_count_zero():
    out = summarize_episodes([{"metrics": {"em": 0.0}, "reward": 0.0}])
    assert out["precision"] == 0.0 and out["docs_read_per_question"] == 0.0 and out["f1"] == 0.0
    assert summarize_episodes([]) == {"episodes": 0}


def test_training_logs_and_evaluation_report_the_same_figures():
    episodes = [Episode(token_ids=[1, 2], loss_mask=[0, 1], sampler_logprobs=[0.0, -1.0], turn_ids=[0, 1],
                        prompt_length=1, example_id=str(i), group_id=i, reward=s["reward"]["total"], info=s,
                        finish_reason="answer", text="") for i, s in enumerate(SUMMARIES)]
    records = [{**s, "reward": s["reward"]["total"], "prediction": s["answer"], "llm_calls": 1,
                "llm_prompt_tokens": 5, "llm_completion_tokens": 2, "latency_s": 0.1, "finish_reason": "answer",
                "searches": []} for s in SUMMARIES]
    training, evaluation = rollout_stats(episodes), summarize(records)
    for key in ("precision", "recall", "fallout", "em", "reward_mean",
                "docs_read_per_question", "searches_per_question", "invalid_per_question", "answered"):
        assert training[key] == pytest.approx(evaluation[key]), key
