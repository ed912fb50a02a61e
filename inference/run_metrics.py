"""Metrics of an evaluation run, computed from its ``predictions.jsonl`` records.

Every question counts in every denominator (unanswered and failed questions score 0), so
methods are compared on the same questions.
"""
from __future__ import annotations

import math
from collections import Counter

from envs.report import summarize_episodes

# (key in metrics.json, column title, format) for the printed summary and --compare
SUMMARY_COLUMNS = (
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "Cover-EM", "{:.3f}"),
    ("acc", "Acc", "{:.3f}"),
    ("searches_per_question", "Searches/q", "{:.2f}"),
    ("docs_read_per_question", "Docs/q", "{:.2f}"),
    ("doc_tokens_per_question", "DocTok/q", "{:.0f}"),
    ("answer_bearing_hit_rate", "AB-hit", "{:.3f}"),
    ("beyond_prefix_fraction", "Beyond-prefix", "{:.3f}"),
    ("llm_tokens_in_per_question", "LLM-in/q", "{:.0f}"),
    ("llm_tokens_out_per_question", "LLM-out/q", "{:.0f}"),
    ("mean_latency_s", "Latency-s", "{:.2f}"),
    ("questions", "N", "{:d}"),
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def admission_stats(records: list[dict]) -> dict[str, float]:
    """SEEDS admission analyses over all search rounds of all questions.

    - answer-bearing hit rate: over rounds whose candidate pool held an answer-bearing passage,
      the fraction where at least one admitted (opened) passage was answer-bearing;
    - beyond-prefix fraction: of all admitted passages, the share whose rank exceeds the number
      admitted in that round (SEEDS Table 3: the part a prefix of the same size would miss).
    """
    pool_rounds = hit_rounds = admitted = beyond = 0
    for record in records:
        for search in record.get("searches", []):
            bearing = search.get("answer_bearing", [])
            opened = search.get("expanded", [])
            if any(bearing):
                pool_rounds += 1
                hit_rounds += any(bearing[i - 1] for i in opened)
            admitted += len(opened)
            beyond += sum(1 for i in opened if i > len(opened))
    return {
        "answer_bearing_hit_rate": hit_rounds / pool_rounds if pool_rounds else math.nan,
        "answer_bearing_rounds": pool_rounds,
        "beyond_prefix_fraction": beyond / admitted if admitted else math.nan,
    }


def summarize(records: list[dict]) -> dict:
    """The ``metrics.json`` of a run: :func:`envs.report.summarize_episodes` of its records (the
    names and pooled formulas every consumer uses) plus the LLM's cost, latency, the SEEDS
    admission analyses and the finish reasons."""
    out: dict = {"questions": len(records)}
    if not records:
        return out
    out.update(summarize_episodes(records))
    del out["episodes"]  # = questions
    out["llm_calls_per_question"] = _mean([r["llm_calls"] for r in records])
    out["llm_tokens_in_per_question"] = _mean([r["llm_prompt_tokens"] for r in records])
    out["llm_tokens_out_per_question"] = _mean([r["llm_completion_tokens"] for r in records])
    out["mean_latency_s"] = _mean([r["latency_s"] for r in records])
    out.update(admission_stats(records))
    out["finish_reasons"] = dict(Counter(r["finish_reason"] for r in records).most_common())
    return out


# metrics.json of runs written before the names were unified -> today's names
LEGACY_NAMES = {"docs_per_question": "docs_read_per_question", "invalid_actions_per_question": "invalid_per_question",
                "reward": "reward_mean", "positive_open_rate": "open_rate_positive",
                "negative_open_rate": "open_rate_negative"}


def with_current_names(metrics: dict) -> dict:
    """A ``metrics.json`` read from disk, its older metric names renamed to today's."""
    return {LEGACY_NAMES.get(key, key): value for key, value in metrics.items()}


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def format_table(rows: dict[str, dict]) -> str:
    """Runs as rows, SUMMARY_COLUMNS as columns, aligned for a terminal."""
    header = ["run"] + [title for _, title, _ in SUMMARY_COLUMNS]
    lines = [header] + [[name] + [_cell(m.get(key), fmt) for key, _, fmt in SUMMARY_COLUMNS]
                        for name, m in rows.items()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
                for line in lines]
    rendered.insert(1, "-" * len(rendered[0]))
    return "\n".join(rendered)
