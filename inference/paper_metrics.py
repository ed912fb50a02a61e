"""Statistics the papers report that our strict metrics do not give (issue 46, item 9).

- :func:`matched_prefix_gain`: SEEDS's hit-rate gain of admission over a rank prefix of the same
  size (§4.3, Figure 3; §C.1). The plain ``answer_bearing_hit_rate`` is 1 by construction for a
  top-k baseline (it reads its whole pool), so it cannot compare admission with reading a prefix;
  the matched prefix can: in each search round, the top-|S| candidates by retrieval rank of the
  same search, |S| the number the method admitted there.
- :func:`kair_own_denominator`: KAIR's accuracy as its code computes it, without the questions its
  code drops (our KAIR repairs instead of dropping, so ``answered_only`` keeps them all).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from envs.bootstrap import RESAMPLES, paired_bootstrap, pooled_ratio
from envs.report import summarize_episodes


def matched_prefix(search: dict, size: int) -> list[int]:
    """Positions (0-based, in shown order) of the ``size`` best-ranked candidates of one search:
    by the ``ranks`` field (shown order may be shuffled; an injected distractor holds the rank of
    the passage it replaced), else in shown order."""
    shown = len(search.get("answer_bearing", []))
    ranks = search.get("ranks")
    order = (sorted(range(shown), key=lambda i: (ranks[i], i)) if isinstance(ranks, list) and len(ranks) == shown
             else list(range(shown)))
    return order[:max(size, 0)]


def matched_prefix_counts(record: dict) -> tuple[int, int, int]:
    """One question's ``(rounds, admitted_hits, prefix_hits)``: its search rounds whose candidate
    pool held an answer-bearing passage (the rounds ``answer_bearing_hit_rate`` counts), of those
    the rounds where an admitted (opened) passage was answer-bearing, and the rounds where one of the
    matched prefix (:func:`matched_prefix`, as many candidates as were admitted) was."""
    rounds = admitted_hits = prefix_hits = 0
    for search in record.get("searches", []):
        bearing = search.get("answer_bearing", [])
        if not any(bearing):
            continue
        opened = [i for i in dict.fromkeys(search.get("expanded", [])) if 1 <= i <= len(bearing)]
        rounds += 1
        admitted_hits += any(bearing[i - 1] for i in opened)
        prefix_hits += any(bearing[i] for i in matched_prefix(search, len(opened)))
    return rounds, admitted_hits, prefix_hits


def matched_prefix_gain(records: Sequence[dict], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """The admitted sets' answer-bearing hit rate against the matched prefixes', pooled over the
    rounds of all questions (as ``answer_bearing_hit_rate``), with a paired bootstrap 95% interval
    of the gain (questions resampled with replacement, the same draw for both rates):

    - ``matched_prefix_hit_rate``: Σ prefix hits / Σ rounds;
    - ``matched_prefix_hit_rate_gain``: the admitted rate minus it (0 for a top-k baseline, whose
      admitted set is its prefix), with ``matched_prefix_hit_rate_gain_ci`` ([low, high]);
    - ``matched_prefix_hit_rate_gain_relative``: admitted / prefix − 1 (NaN when the prefix rate is 0).

    NaN (and no interval) when no round's pool held an answer-bearing passage.
    """
    counts = np.array([matched_prefix_counts(r) for r in records], dtype=np.float64).reshape(-1, 3)
    rounds, admitted, prefix = counts.T
    if not rounds.sum():
        return {"matched_prefix_hit_rate": math.nan, "matched_prefix_hit_rate_gain": math.nan}
    difference = paired_bootstrap({"hits": prefix, "rounds": rounds}, {"hits": admitted, "rounds": rounds},
                                  pooled_ratio("hits", "rounds"), resamples=resamples, seed=seed)
    relative = difference.after / difference.before - 1 if difference.before else math.nan
    return {"matched_prefix_hit_rate": difference.before, "matched_prefix_hit_rate_gain": difference.diff,
            "matched_prefix_hit_rate_gain_ci": [difference.lo, difference.hi],
            "matched_prefix_hit_rate_gain_relative": relative}


# ----- KAIR's own denominator ----------------------------------------------------------------------

def is_kair_record(record: dict) -> bool:
    """Whether a record comes from ``methods.kair`` (its ``method_stats`` signature)."""
    stats = record.get("method_stats") or {}
    return "judgements" in stats and "index_format" in stats


def kair_drop_reason(record: dict) -> str | None:
    """Why KAIR's code (src/KAIR.py; shared/notes/seed_methods.md §2.4) would have dropped this
    question, or None: any exception in its loop leaves the question out of every metric.

    - ``judgement_missing``: a step's judgement was still missing after its (one) retry; KAIR's loop
      test on it raises. Our last step asks no repair, so a judgement missing there counts too (KAIR
      would retry it first: this can count a question KAIR would have kept);
    - ``no_query``: the judgement was insufficient but no next query was written; KAIR retrieves
      with None, which raises;
    - ``llm_error``: a step's LLM call failed (an exception in KAIR's loop).
    """
    stats = record.get("method_stats") or {}
    if stats.get("stop") in ("no_query", "llm_error"):
        return stats["stop"]
    if any(judgement is None for judgement in stats.get("judgements") or []):
        return "judgement_missing"
    return None


def kair_own_denominator(records: Sequence[dict]) -> dict:
    """KAIR's figures over the questions its code would keep (:func:`kair_drop_reason`), as its
    paper's tables count them: ``questions`` kept, ``dropped`` and ``dropped_reasons``, and the
    answer metrics of the kept questions (an unanswered kept question still scores 0)."""
    reasons = [kair_drop_reason(r) for r in records]
    kept = [r for r, reason in zip(records, reasons) if reason is None]
    out: dict = {"questions": len(kept), "dropped": len(records) - len(kept),
                 "dropped_reasons": dict(Counter(reason for reason in reasons if reason).most_common())}
    if kept:
        summary = summarize_episodes(kept)
        out.update({k: v for k, v in summary.items() if k not in ("episodes", "answered")})
    return out
