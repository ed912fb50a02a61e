"""Run metrics: SEEDS admission (opening) statistics, the answered-only (paper-style) section, the table."""
import json
import math

import pytest
from test_evaluate import argv, setup  # noqa: F401  (the evaluation fixture)

from inference import evaluate as ev
from inference.predictions import load_predictions
from inference.run_metrics import answered_only, departs_from_prefix, format_table, opening_stats, summarize


def search(ranks, expanded, distractor=None, bearing=None):
    n = len(ranks)
    return {"ranks": ranks, "expanded": expanded, "distractor": distractor or [False] * n,
            "answer_bearing": bearing or [False] * n, "ids": [f"d{r}" for r in ranks]}


def test_prefix_departure_uses_retrieval_ranks_not_shown_numbers():
    assert not departs_from_prefix([]) and not departs_from_prefix([2, 1]) and departs_from_prefix([1, 3])
    records = [{"searches": [
        search([3, 1, 2], [2, 3]),  # shuffled: shown 2, 3 are ranks 1, 2 = the prefix
        search([1, 2, 3, 4], [1, 3]),  # ranks 1, 3: departs; rank 3 is beyond the prefix of 2
        search([1, 2, 3], []),  # admits nothing: not a round of the departure rate
        search([1, 2], [1, 2]),  # everything (a prefix method): no departure
    ]}]
    stats = opening_stats(records)
    assert stats["opening_rounds"] == 3 and stats["prefix_departure_rate"] == pytest.approx(1 / 3)
    assert stats["beyond_prefix_fraction"] == pytest.approx(1 / 6)
    assert "distractor_open_rate" not in stats  # no distractors were injected


def test_distractor_open_rate_pools_injected_candidates():
    records = [
        {"searches": [search([1, 2, 3, 4], [1, 2], distractor=[True, False, True, True])]},  # 3 shown, 1 opened
        {"searches": [search([1, 2], [2, 2], distractor=[False, True])]},  # 1 shown, opened (once)
    ]
    stats = opening_stats(records)
    assert stats["distractors_shown"] == 4 and stats["distractors_opened"] == 2
    assert stats["distractor_open_rate"] == 0.5


def record(rid, prediction, em, finish, docs=1):
    return {"id": rid, "prediction": prediction, "metrics": {"em": em, "f1": em}, "finish_reason": finish,
            "docs_read": docs, "reward": em, "searches": [], "llm_calls": 1, "llm_prompt_tokens": 10,
            "llm_completion_tokens": 2, "latency_s": 0.1}


def test_answered_only_excludes_failed_questions_and_counts_them():
    records = [record("a", "Paris", 1.0, "answered"), record("b", "Rome", 0.0, "answered"),
               record("c", None, 0.0, "llm_error", docs=5), record("d", None, 0.0, "env_limit")]
    strict = summarize(records)
    assert strict["em"] == 0.25 and strict["answered"] == 0.5
    paper = strict["answered_only"]
    assert paper == answered_only(records)
    assert paper["questions"] == 2 and paper["excluded"] == 2
    assert paper["excluded_reasons"] == {"llm_error": 1, "env_limit": 1}
    assert paper["em"] == 0.5 and paper["docs_read_per_question"] == 1.0 and "answered" not in paper
    nothing = answered_only([record("c", None, 0.0, "error: ValueError")])
    assert nothing == {"questions": 0, "excluded": 1, "excluded_reasons": {"error: ValueError": 1}}
    table = format_table({"run": strict}).splitlines()
    assert "EM-answered" in table[0] and "0.500" in table[2]


def test_a_run_with_injected_distractors_reports_how_many_were_opened(setup, tmp_path):  # noqa: F811
    env = tmp_path / "env.yaml"
    env.write_text("distractor_rate: 0.5\n")
    ev.main(argv(setup, "seeds-react", "--env_config", str(env)))
    metrics = json.loads((setup["out"] / "metrics.json").read_text())
    records = load_predictions(setup["out"] / "predictions.jsonl")
    rounds = [s for r in records for s in r["searches"]]
    shown = sum(sum(s["distractor"]) for s in rounds)
    opened = sum(s["distractor"][i - 1] for s in rounds for i in s["expanded"])
    assert shown > 0 and metrics["distractors_shown"] == shown
    assert metrics["distractor_open_rate"] == pytest.approx(opened / shown)
    assert metrics["answered_only"]["questions"] == 3 and metrics["answered_only"]["em"] == pytest.approx(1 / 3)
    assert not math.isnan(metrics["prefix_departure_rate"])
