"""One summary of many episodes, for every consumer: the env demo (``scripts/demo_episodes.py``),
the training logs (:func:`training.rollouts.rollout.rollout_stats`) and evaluation runs
(:func:`inference.run_metrics.summarize`).

Input: end-of-episode summaries as the env writes them (``info["episode"]``, also
``Episode.info`` of a training rollout and the ``predictions.jsonl`` records of an evaluation),
of which it reads ``metrics``, ``reward`` (the env's ``{"total": …}`` or a number), ``answer``
or ``prediction``, ``n_searches``, ``n_actions``, ``n_invalid``, ``docs_read``, ``doc_tokens``,
``docs_shown``, ``positives_shown``, ``positives_opened``, ``negatives_opened`` and
``positives_missed``; a key an episode lacks (one that ended in an error) counts 0. Episodes over a
retriever that reads pages (the live web) also have ``pages_fetched`` and ``page_failures``: when
any episode has them, ``pages_fetched_per_question`` and ``page_failures_per_question`` are
reported too (means over all episodes; docs/web_search.md).

Formulas: every episode counts in every denominator (an episode that never answered scores 0).
Per-question figures are means over episodes (``*_per_question``, answer metrics,
``reward_mean``, ``answered``). Selection figures are POOLED over the episodes, so an episode
that opened many documents weighs more than one that opened one:

- ``precision`` = Σ positives opened / Σ documents opened;
- ``recall`` = Σ positives opened / Σ positives shown;
- ``fallout`` = Σ negatives opened / Σ negatives shown (IR's fall-out, the false-positive rate);

each 0 when its denominator is 0 (opening nothing selects nothing right).

Run files written before these names (``metrics.json`` of evaluation runs, ``eval.json`` and
``metrics.jsonl`` of training runs) are read under them through ONE mapping, :data:`LEGACY_NAMES`
(:func:`with_current_names`); no reader keeps old names of its own.

An episode is *answered* (:func:`is_answered`) when it ended with an answer the env accepted:
its ``answer`` (``prediction`` in an evaluation record) is not None. Every other ending (no
answer, an empty answer, an LLM or method error, the LLM-call limit, the env's action or search
limit) is unanswered; an evaluation record's ``finish_reason`` says which.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

ANSWER_METRICS = ("em", "f1", "f1_hotpot", "cover_em", "acc")
# summary key -> reported name (a mean over episodes)
PER_QUESTION = {"n_searches": "searches_per_question", "n_actions": "actions_per_question",
                "n_invalid": "invalid_per_question", "docs_read": "docs_read_per_question",
                "doc_tokens": "doc_tokens_per_question", "positives_opened": "positives_opened_per_question",
                "negatives_opened": "negatives_opened_per_question",
                "positives_missed": "positives_missed_per_question",
                "docs_shown": "docs_shown_per_question", "positives_shown": "positives_shown_per_question"}
# reported only when some episode has the key (a retriever that reads pages: the live web)
PAGE_COUNTS = {"pages_fetched": "pages_fetched_per_question", "page_failures": "page_failures_per_question"}


def episode_reward(summary: Mapping) -> float:
    """The episode's total reward: the env's ``{"total": …}`` or an evaluation record's number."""
    reward = summary.get("reward", 0.0)
    return float(reward.get("total", 0.0) if isinstance(reward, Mapping) else reward)


def is_answered(summary: Mapping) -> bool:
    """Whether the episode ended with an accepted answer (module docstring)."""
    return summary.get("answer", summary.get("prediction")) is not None


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def summarize_episodes(summaries: Sequence[Mapping]) -> dict[str, float]:
    """The metrics of many episodes under one set of names (module docstring: the formulas)."""
    n = len(summaries)
    if n == 0:
        return {"episodes": 0}

    def total(key: str) -> float:
        return float(sum(s.get(key, 0) or 0 for s in summaries))

    out: dict[str, float] = {"episodes": n}
    present = [m for m in ANSWER_METRICS if any(m in s.get("metrics", {}) for s in summaries)]
    for metric in dict.fromkeys(("em", "f1", *present)):
        out[metric] = sum(float(s.get("metrics", {}).get(metric, 0.0)) for s in summaries) / n
    rewards = [episode_reward(s) for s in summaries]
    out["reward_mean"] = sum(rewards) / n
    out["reward_std"] = math.sqrt(sum((r - out["reward_mean"]) ** 2 for r in rewards) / n)
    out["answered"] = sum(is_answered(s) for s in summaries) / n
    for key, name in PER_QUESTION.items():
        out[name] = total(key) / n
    for key, name in PAGE_COUNTS.items():
        if any(key in s for s in summaries):
            out[name] = total(key) / n
    positives_shown = total("positives_shown")
    out["precision"] = _ratio(total("positives_opened"), total("docs_read"))
    out["recall"] = _ratio(total("positives_opened"), positives_shown)
    out["fallout"] = _ratio(total("negatives_opened"), max(total("docs_shown") - positives_shown, 0.0))
    return out


# metric names of run files written before the names were unified -> today's names: THE one mapping
# every reader of an old metrics.json, eval.json or metrics.jsonl goes through
LEGACY_NAMES = {"docs_per_question": "docs_read_per_question", "invalid_actions_per_question": "invalid_per_question",
                "reward": "reward_mean", "positive_open_rate": "recall", "open_rate_positive": "recall",
                "negative_open_rate": "fallout", "open_rate_negative": "fallout",
                "selection_precision": "precision", "distractor_admission_rate": "distractor_open_rate",
                "distractors_admitted": "distractors_opened", "admitting_rounds": "opening_rounds"}
# nested summaries renamed too: metrics.json's answered-only figures, eval.json's two evaluations
NESTED_SUMMARIES = ("answered_only", "before", "after")


def current_name(key: str) -> str:
    """Today's name of a metric key; a prefix before the last ``/`` is kept (``eval/<metric>`` of
    metrics.jsonl)."""
    prefix, slash, name = key.rpartition("/")
    return prefix + slash + LEGACY_NAMES.get(name, name)


def with_current_names(summary: Mapping) -> dict:
    """A summary read from disk (a ``metrics.json``, an ``eval.json``, a ``metrics.jsonl`` record)
    with its older metric names renamed to today's, in its nested summaries too (:data:`NESTED_SUMMARIES`)."""
    return {current_name(key): with_current_names(value) if key in NESTED_SUMMARIES and isinstance(value, Mapping)
            else value for key, value in summary.items()}
