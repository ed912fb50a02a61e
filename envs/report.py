"""Aggregate end-of-episode summaries (``info["episode"]``) into one table row."""
from __future__ import annotations

import math


def aggregate_episodes(summaries: list[dict]) -> dict[str, float]:
    """Means over episodes: answer metrics, reward, evidence consumption and selection quality.

    Every episode counts in every denominator, including ones that ended without an answer.
    """
    n = len(summaries)
    if n == 0:
        return {"episodes": 0}
    out: dict[str, float] = {"episodes": n}
    for metric in summaries[0]["metrics"]:
        out[metric] = sum(s["metrics"][metric] for s in summaries) / n
    for key in ("n_searches", "n_actions", "n_invalid", "docs_read", "doc_tokens", "positives_opened",
                "negatives_opened", "positives_missed", "selection_precision"):
        out[key] = sum(s[key] for s in summaries) / n
    out["reward"] = sum(s["reward"]["total"] for s in summaries) / n
    out["answered"] = sum(s["answer"] is not None for s in summaries) / n
    shown = sum(s["positives_shown"] for s in summaries)
    negatives = sum(s["docs_shown"] - s["positives_shown"] for s in summaries)
    out["positive_open_rate"] = sum(s["positives_opened"] for s in summaries) / shown if shown else math.nan
    out["negative_open_rate"] = sum(s["negatives_opened"] for s in summaries) / negatives if negatives else math.nan
    return out
