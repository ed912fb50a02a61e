"""Run files written under older metric names read under today's, through the one mapping of
envs/report.py (LEGACY_NAMES): an evaluation run's metrics.json, a training run's eval.json and
metrics.jsonl."""
import json

import pytest

from envs.report import LEGACY_NAMES, summarize_episodes, with_current_names
from inference.run_metrics import format_table
from training.evaluation import curves

# an evaluation run's metrics.json as runs wrote it before the names were unified
OLD_METRICS = {"questions": 4, "em": 0.5, "reward": 0.3, "docs_per_question": 2.0,
               "invalid_actions_per_question": 0.25, "selection_precision": 0.4, "positive_open_rate": 0.6,
               "negative_open_rate": 0.2, "admitting_rounds": 3, "distractors_shown": 10, "distractors_admitted": 1,
               "distractor_admission_rate": 0.1, "answered_only": {"questions": 3, "selection_precision": 0.5,
                                                                    "open_rate_positive": 0.7}}
# a training run's eval.json: the summaries are renamed; the comparison and per-question outcomes keep theirs
OLD_EVALUATION = {
    "before": {"reward_mean": 0.1, "em": 0.25, "selection_precision": 0.2, "open_rate_positive": 0.5,
               "open_rate_negative": 0.3, "docs_read_per_question": 3.0},
    "after": {"reward_mean": 0.4, "em": 0.5, "selection_precision": 0.6, "open_rate_positive": 0.4,
              "open_rate_negative": 0.1, "docs_read_per_question": 1.0},
    "questions": 2,
    "comparison": {"reward": {"before": 0.1, "after": 0.4, "diff": 0.3, "lo": 0.1, "hi": 0.5}},
    "per_question": {"before": {"reward": [0.0, 0.2], "em": [0.0, 0.5], "positives_opened": [1.0, 0.0],
                                "docs_read": [3.0, 3.0]}},
}
# two lines of a training run's metrics.jsonl, one with the periodic evaluation's eval/<metric>
OLD_UPDATES = [{"update": 1, "reward_mean": 0.1, "selection_precision": 0.3, "open_rate_positive": 0.6,
                "open_rate_negative": 0.4, "finish/answer": 1.0},
               {"update": 2, "reward_mean": 0.2, "selection_precision": 0.35, "open_rate_positive": 0.55,
                "eval/selection_precision": 0.5, "eval/open_rate_positive": 0.45}]


def old_names_in(summary: dict) -> set[str]:
    return {key.rpartition("/")[2] for key in summary} & set(LEGACY_NAMES)


def test_an_old_metrics_json_reads_under_todays_names(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(OLD_METRICS))
    metrics = with_current_names(json.loads(path.read_text()))
    assert metrics["precision"] == 0.4 and metrics["recall"] == 0.6 and metrics["fallout"] == 0.2
    assert metrics["reward_mean"] == 0.3 and metrics["docs_read_per_question"] == 2.0
    assert metrics["invalid_per_question"] == 0.25 and metrics["opening_rounds"] == 3
    assert metrics["distractors_opened"] == 1 and metrics["distractor_open_rate"] == 0.1
    assert metrics["answered_only"] == {"questions": 3, "precision": 0.5, "recall": 0.7}
    assert not old_names_in(metrics) and not old_names_in(metrics["answered_only"])
    table = format_table({"old": metrics}).splitlines()
    header, row = table[0].split(), table[2].split()
    assert row[header.index("Docs/q")] == "2.00" and row[header.index("Distr-open")] == "0.100"


def test_an_old_eval_json_reads_under_todays_names(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps(OLD_EVALUATION))
    evaluation = curves.read_evaluation(tmp_path / "eval.json")
    assert evaluation["before"] == {"reward_mean": 0.1, "em": 0.25, "precision": 0.2, "recall": 0.5,
                                    "fallout": 0.3, "docs_read_per_question": 3.0}
    assert curves.evaluation_value(evaluation, "after", "recall") == 0.4
    assert curves.evaluation_value(evaluation, "after", "fallout") == 0.1
    assert evaluation["comparison"] == OLD_EVALUATION["comparison"]  # statistics' names: reward stays reward
    assert evaluation["per_question"] == OLD_EVALUATION["per_question"]


def test_an_old_metrics_jsonl_reads_under_todays_names(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in OLD_UPDATES))
    first, second = curves.read_metrics(tmp_path / "metrics.jsonl")
    assert (first["precision"], first["recall"], first["fallout"]) == (0.3, 0.6, 0.4)
    assert first["finish/answer"] == 1.0
    assert (second["eval/precision"], second["eval/recall"]) == (0.5, 0.45)
    assert not old_names_in(first) and not old_names_in(second)


def test_todays_summary_uses_no_old_name():
    summary = summarize_episodes([{"metrics": {"em": 1.0}, "reward": 1.0, "docs_read": 2, "positives_opened": 1,
                                   "negatives_opened": 1, "positives_shown": 1, "docs_shown": 5}])
    assert not old_names_in(summary)
    assert summary["precision"] == 0.5 and summary["recall"] == 1.0 and summary["fallout"] == pytest.approx(1 / 4)
