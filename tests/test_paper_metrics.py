"""Issue 46, item 9: the matched-prefix hit-rate gain (SEEDS §4.3, §C.1) and KAIR's own denominator,
on hand-made records whose values are worked out by hand below."""
import math

import numpy as np
import pytest

from inference.paper_metrics import (
    kair_drop_reason,
    kair_own_denominator,
    matched_prefix,
    matched_prefix_counts,
    matched_prefix_gain,
)
from inference.run_metrics import format_table, summarize


def search(bearing, expanded, ranks=None):
    return {"query": "q", "ids": [f"d{i}" for i in range(len(bearing))], "answer_bearing": bearing,
            "expanded": expanded, "ranks": ranks if ranks is not None else list(range(1, len(bearing) + 1))}


# q1: round 1 admits candidate 3 (answer-bearing; the prefix of size 1 is candidate 1: no);
#     round 2's pool has no answer-bearing passage (not counted);
#     round 3 admits 1 and 2 (neither bearing; the prefix of size 2 = candidates 1, 2: no).
# q2: round 1 admits nothing (prefix of size 0: no), although candidate 1 is answer-bearing;
#     round 2 shows candidates shuffled: ranks [3, 1, 2]; it admits candidate 1 (rank 3, bearing);
#     the best-ranked candidate is candidate 2 (rank 1), not bearing: prefix no.
# q3: a top-k reader: admits 1, 2 of which 2 is bearing; its prefix is the same set: both hit.
Q1 = {"searches": [search([0, 0, 1], [3]), search([0, 0, 0], [1]), search([0, 0, 1, 0], [1, 2])]}
Q2 = {"searches": [search([1, 0], []), search([1, 0, 0], [1], ranks=[3, 1, 2])]}
Q3 = {"searches": [search([0, 1], [1, 2])]}


def test_matched_prefix_counts_by_hand():
    assert matched_prefix_counts(Q1) == (2, 1, 0)
    assert matched_prefix_counts(Q2) == (2, 1, 0)
    assert matched_prefix_counts(Q3) == (1, 1, 1)
    assert matched_prefix(search([0, 1, 0], [], ranks=[3, 1, 2]), 2) == [1, 2]  # by rank, not shown order
    assert matched_prefix({"answer_bearing": [1, 0], "ranks": None}, 1) == [0]  # no ranks: shown order


def test_matched_prefix_gain_by_hand():
    out = matched_prefix_gain([Q1, Q2, Q3], resamples=500)
    # rounds 2 + 2 + 1 = 5; admitted hits 1 + 1 + 1 = 3 (rate 0.6); prefix hits 0 + 0 + 1 = 1 (rate 0.2)
    assert out["matched_prefix_hit_rate"] == pytest.approx(0.2)
    assert out["matched_prefix_hit_rate_gain"] == pytest.approx(0.4)
    assert out["matched_prefix_hit_rate_gain_relative"] == pytest.approx(2.0)
    low, high = out["matched_prefix_hit_rate_gain_ci"]
    assert -1 <= low <= 0.4 <= high <= 1
    top_k = matched_prefix_gain([Q3, Q3], resamples=50)  # a prefix reader gains nothing, with certainty
    assert top_k["matched_prefix_hit_rate_gain"] == 0 and top_k["matched_prefix_hit_rate_gain_ci"] == [0, 0]
    assert math.isnan(matched_prefix_gain([{"searches": [search([0, 0], [1])]}])["matched_prefix_hit_rate_gain"])


def record(stats, prediction="Paris", em=1.0):
    return {"prediction": prediction, "metrics": {"em": em, "f1": em}, "method_stats": stats,
            "finish_reason": "answered" if prediction is not None else "no_answer", "searches": [],
            "llm_calls": 1, "llm_prompt_tokens": 1, "llm_completion_tokens": 1, "latency_s": 0.1}


def kair(judgements, stop, **kwargs):
    return record({"variant": "full", "index_format": "keywords_relations", "steps": len(judgements),
                   "judgements": judgements, "stop": stop}, **kwargs)


def test_kair_drop_reasons_follow_kairs_code():
    assert kair_drop_reason(kair(["insufficient", "sufficient"], "sufficient")) is None
    assert kair_drop_reason(kair(["insufficient", None], "max_steps")) == "judgement_missing"
    assert kair_drop_reason(kair([None], "no_query")) == "no_query"
    assert kair_drop_reason(kair([], "llm_error")) == "llm_error"


def test_kair_own_denominator_by_hand():
    records = [kair(["sufficient"], "sufficient"),  # kept, right
               kair(["insufficient", "sufficient"], "sufficient", em=0.0),  # kept, wrong
               kair(["insufficient", None], "max_steps"),  # dropped (right, but KAIR never scores it)
               kair(["insufficient"], "no_query", em=0.0),  # dropped
               kair(["insufficient", "insufficient"], "max_steps", prediction=None, em=0.0)]  # kept, unanswered
    own = kair_own_denominator(records)
    assert (own["questions"], own["dropped"]) == (3, 2)
    assert own["dropped_reasons"] == {"judgement_missing": 1, "no_query": 1}
    assert own["em"] == pytest.approx(1 / 3)  # 1 right of the 3 kept
    metrics = summarize(records)
    assert metrics["em"] == pytest.approx(2 / 5)  # strict: every question
    assert metrics["answered_only"]["em"] == pytest.approx(2 / 4)  # non-null predictions
    assert metrics["kair_own_denominator"]["em"] == pytest.approx(1 / 3)
    assert "kair_own_denominator" not in summarize([record({"variant": "full"})])  # KAIR only


def test_the_gain_is_in_metrics_json_and_the_summary_table():
    records = [{**record({}), **q} for q in (Q1, Q2, Q3)]
    metrics = summarize(records)
    assert metrics["answer_bearing_hit_rate"] == pytest.approx(0.6)
    assert metrics["matched_prefix_hit_rate_gain"] == pytest.approx(0.4)
    assert "AB-gain" in format_table({"run": metrics}) and "+0.400" in format_table({"run": metrics})


def test_the_analysis_reports_the_gain():
    from inference.analysis import analyse_records, summary_table

    records = [{"id": f"q{i}", "question": "Q?", "latency_s": 0.1, **q} for i, q in enumerate((Q1, Q2, Q3))]
    out = analyse_records(records, embed=lambda texts: np.ones((len(texts), 4)))
    assert out["matched_prefix"]["matched_prefix_hit_rate_gain"] == pytest.approx(0.4)
    assert "AB-gain" in summary_table({"run": out}) and "+0.400" in summary_table({"run": out})
