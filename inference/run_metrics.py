"""Metrics of an evaluation run, computed from its ``predictions.jsonl`` records.

Every question counts in every denominator (unanswered and failed questions score 0), so
methods are compared on the same questions. Beside these strict figures, ``answered_only``
holds the paper-style ones over answered questions (:func:`answered_only`) and, for KAIR, those
over the questions KAIR's code would keep (``kair_own_denominator``; :mod:`inference.paper_metrics`).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

from envs.report import is_answered, summarize_episodes
from inference.paper_metrics import is_kair_record, kair_own_denominator, matched_prefix_gain

# (key in metrics.json, a.b for a nested one; column title; format) for the printed summary and --compare
SUMMARY_COLUMNS = (
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "Cover-EM", "{:.3f}"),
    ("acc", "Acc", "{:.3f}"),
    ("searches_per_question", "Searches/q", "{:.2f}"),
    ("docs_read_per_question", "Docs/q", "{:.2f}"),
    ("doc_tokens_per_question", "DocTok/q", "{:.0f}"),
    ("pages_fetched_per_question", "Pages/q", "{:.2f}"),
    ("answer_bearing_hit_rate", "AB-hit", "{:.3f}"),
    ("matched_prefix_hit_rate_gain", "AB-gain", "{:+.3f}"),
    ("beyond_prefix_fraction", "Beyond-prefix", "{:.3f}"),
    ("prefix_departure_rate", "Prefix-dep", "{:.3f}"),
    ("distractor_open_rate", "Distr-open", "{:.3f}"),
    ("answered_only.em", "EM-answered", "{:.3f}"),
    ("llm_tokens_in_per_question", "LLM-in/q", "{:.0f}"),
    ("llm_tokens_out_per_question", "LLM-out/q", "{:.0f}"),
    ("mean_latency_s", "Latency-s", "{:.2f}"),
    ("questions", "N", "{:d}"),
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _opened_ranks(search: dict) -> list[int]:
    """Retrieval ranks of the candidates opened (the paper: admitted) in one search round, without repeats.

    The ``ranks`` field gives each shown candidate's rank (the shown order may be shuffled; an
    injected distractor takes the rank of the passage it replaced); records without it fall back
    to the candidate numbers."""
    opened = list(dict.fromkeys(search.get("expanded", [])))
    ranks = search.get("ranks")
    if isinstance(ranks, list) and all(1 <= i <= len(ranks) for i in opened):
        return [int(ranks[i - 1]) for i in opened]
    return opened


def departs_from_prefix(ranks: list[int]) -> bool:
    """Whether an opened set (its retrieval ranks) differs from the top-|S| rank prefix, i.e.
    holds a rank above |S| (SEEDS §4.3 / §C.1); an empty set is the empty prefix."""
    return any(rank > len(ranks) for rank in ranks)


def opening_stats(records: list[dict]) -> dict[str, float]:
    """SEEDS's admission analyses (the paper's word for opening), pooled over all search rounds (one
    round = one search: its candidates and the subset opened from them) of all questions.

    - ``answer_bearing_hit_rate``: over rounds whose candidate pool held an answer-bearing passage,
      the fraction where at least one opened passage was answer-bearing (§C.1, Fig. 4a);
    - ``beyond_prefix_fraction``: of all opened passages, the share whose retrieval rank exceeds
      the number opened in that round (Table 3: the part a prefix of the same size would miss);
    - ``prefix_departure_rate``: of the rounds that opened at least one passage
      (``opening_rounds``), the share whose opened set is not the rank prefix of its size
      (§4.3: "prefix departures in roughly 80% of rounds");
    - ``distractor_open_rate`` (only when distractors were injected, ``distractor_rate`` > 0):
      opened injected distractors / injected distractors shown (§4.4's distractor admission: "fewer
      than 8%"), with ``distractors_shown`` and ``distractors_opened``.
    """
    pool_rounds = hit_rounds = opened_total = beyond = opening = departing = shown_fake = opened_fake = 0
    for record in records:
        for search in record.get("searches", []):
            bearing = search.get("answer_bearing", [])
            opened = list(dict.fromkeys(search.get("expanded", [])))
            if any(bearing):
                pool_rounds += 1
                hit_rounds += any(bearing[i - 1] for i in opened)
            ranks = _opened_ranks(search)
            opened_total += len(ranks)
            beyond += sum(1 for rank in ranks if rank > len(ranks))
            opening += bool(ranks)
            departing += departs_from_prefix(ranks)
            fake = search.get("distractor") or []
            shown_fake += sum(map(bool, fake))
            opened_fake += sum(1 for i in opened if 1 <= i <= len(fake) and fake[i - 1])
    out = {
        "answer_bearing_hit_rate": hit_rounds / pool_rounds if pool_rounds else math.nan,
        "answer_bearing_rounds": pool_rounds,
        "beyond_prefix_fraction": beyond / opened_total if opened_total else math.nan,
        "prefix_departure_rate": departing / opening if opening else math.nan,
        "opening_rounds": opening,
    }
    if shown_fake:
        out.update(distractor_open_rate=opened_fake / shown_fake, distractors_shown=shown_fake,
                   distractors_opened=opened_fake)
    return out


def answered_only(records: list[dict]) -> dict:
    """The paper-style figures: :func:`envs.report.summarize_episodes` over the answered questions
    only (:func:`envs.report.is_answered`), as KAIR reports (its failed questions leave the
    denominator), with ``excluded`` (the count left out) and their ``excluded_reasons``."""
    kept = [r for r in records if is_answered(r)]
    out: dict = {"questions": len(kept), "excluded": len(records) - len(kept)}
    out["excluded_reasons"] = dict(Counter(r.get("finish_reason", "no_answer") for r in records
                                           if not is_answered(r)).most_common())
    if kept:
        summary = summarize_episodes(kept)
        out.update({k: v for k, v in summary.items() if k not in ("episodes", "answered")})
    return out


def thinking_cut_offs(records: list[dict]) -> dict[str, int]:
    """Calls whose token budget ran out inside a leading ``<think>`` block (their trace entries say
    ``"thinking": "cut_off"``, :meth:`methods.context.QuestionContext.generate`): ``thinking_cut_offs``
    (calls) and ``thinking_cut_off_questions`` (questions with at least one)."""
    per_question = [sum(1 for e in r.get("trace") or [] if e.get("type") == "llm" and e.get("thinking") == "cut_off")
                    for r in records]
    return {"thinking_cut_offs": sum(per_question), "thinking_cut_off_questions": sum(1 for n in per_question if n)}


def summarize(records: list[dict]) -> dict:
    """The ``metrics.json`` of a run: :func:`envs.report.summarize_episodes` of its records (the
    names and pooled formulas every consumer uses) plus the LLM's cost, latency, thinking cut-offs,
    the SEEDS admission analyses (:func:`opening_stats`) with the matched-prefix hit-rate gain
    (:func:`inference.paper_metrics.matched_prefix_gain`), the finish reasons and, for KAIR, its
    code's own denominator (``kair_own_denominator``: :func:`inference.paper_metrics.kair_own_denominator`)."""
    out: dict = {"questions": len(records)}
    if not records:
        return out
    out.update(summarize_episodes(records))
    del out["episodes"]  # = questions
    out["llm_calls_per_question"] = _mean([r["llm_calls"] for r in records])
    out["llm_tokens_in_per_question"] = _mean([r["llm_prompt_tokens"] for r in records])
    out["llm_tokens_out_per_question"] = _mean([r["llm_completion_tokens"] for r in records])
    out["mean_latency_s"] = _mean([r["latency_s"] for r in records])
    out.update(thinking_cut_offs(records))
    out.update(opening_stats(records))
    out.update(matched_prefix_gain(records))
    out["answered_only"] = answered_only(records)
    if any(is_kair_record(r) for r in records):
        out["kair_own_denominator"] = kair_own_denominator(records)
    out["finish_reasons"] = dict(Counter(r["finish_reason"] for r in records).most_common())
    return out


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _lookup(metrics: dict, key: str):
    """``metrics[key]``, where ``a.b`` reads ``metrics["a"]["b"]``; None when absent."""
    value: Any = metrics
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def format_table(rows: dict[str, dict]) -> str:
    """Runs as rows, SUMMARY_COLUMNS as columns, aligned for a terminal."""
    header = ["run"] + [title for _, title, _ in SUMMARY_COLUMNS]
    lines = [header] + [[name] + [_cell(_lookup(m, key), fmt) for key, _, fmt in SUMMARY_COLUMNS]
                        for name, m in rows.items()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
                for line in lines]
    rendered.insert(1, "-" * len(rendered[0]))
    return "\n".join(rendered)
