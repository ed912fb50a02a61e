"""Greedy evaluation of the policy on held-out questions, and the paired bootstrap of a change.

The trainer evaluates the policy before and after PPO on the same questions with the same env
seeds (same candidates, same shuffled order), so each question gives a PAIRED outcome. The
difference after − before is reported with a paired bootstrap 95% interval: questions are
resampled with replacement (the same resample for both runs) and the statistic recomputed
(the bootstrap itself is :mod:`envs.bootstrap`, shared with ``inference.evaluate --compare``).

Per-question outcomes (:func:`question_outcomes`) are the episode's reward, EM, positives opened,
documents read and two of the reward's parts (:meth:`envs.episode.Episode.reward_breakdown`: the
selection term and the format penalties; the answer term is the rest); the statistics are the mean
reward, the mean EM, the POOLED selection precision (positives opened / documents opened over the
resampled questions, as :func:`training.rollouts.rollout.rollout_stats` pools it) and the means of the two
parts, so a change of the reward can be read apart from the answers that flipped. An ``eval.json``
written before the parts were recorded has the first four outcomes only: its comparisons have the
first three statistics (:func:`statistics_of`). Since 2026-12-04 each question also records whether the
episode opened anything and whether its answer is the title of the first passage it opened
(:func:`training.evaluation.answer_sources.answer_source`); ``reading`` pools them (answers from the first opened
title / questions that opened something), so a change in what the answers come from can be read apart
from a change in how much is opened. Since 2026-12-05 each question also records the positives its
snapshots showed, and ``recall`` pools them (positives opened / positives shown): precision can rise by
opening fewer documents, and recall says how many of the positives that costs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from envs.bootstrap import PairedDifference, Statistic, mean_of, pooled_f1, pooled_ratio
from envs.bootstrap import paired_bootstrap as shared_paired_bootstrap
from envs.protocol import yes_prob
from training.evaluation.answer_sources import answer_source, copies_question, opened_and_shown

CORE_OUTCOME_KEYS = ("reward", "em", "positives_opened", "docs_read")  # in every eval.json
REWARD_PART_KEYS = ("selection_reward", "format_reward")  # recorded since 2026-12-03
READING_KEYS = ("opened_any", "answered_first_opened")  # recorded since 2026-12-04 (experiments/reader_study.md)
SHOWN_KEYS = ("positives_shown",)  # recorded since 2026-12-05: the denominator of recall
COPY_KEYS = ("copied_question",)  # recorded since 2026-12-06: the answer is mostly the question's words
OPTIONAL_OUTCOME_KEYS = REWARD_PART_KEYS + READING_KEYS + SHOWN_KEYS + COPY_KEYS  # read where an eval.json has them
OUTCOME_KEYS = CORE_OUTCOME_KEYS + OPTIONAL_OUTCOME_KEYS


def question_outcomes(episodes: Sequence) -> dict[str, np.ndarray]:
    """Per-episode arrays (n,) of :data:`OUTCOME_KEYS` from rollout episodes."""
    return {
        "reward": np.array([e.reward for e in episodes], dtype=np.float64),
        "em": np.array([e.info.get("metrics", {}).get("em", 0.0) for e in episodes], dtype=np.float64),
        "positives_opened": np.array([e.info.get("positives_opened", 0) for e in episodes], dtype=np.float64),
        "docs_read": np.array([e.info.get("docs_read", 0) for e in episodes], dtype=np.float64),
        "positives_shown": np.array([e.info.get("positives_shown", 0) for e in episodes], dtype=np.float64),
        "selection_reward": np.array([reward_part(e, "selection") for e in episodes], dtype=np.float64),
        "format_reward": np.array([reward_part(e, "format") for e in episodes], dtype=np.float64),
        "opened_any": np.array([bool(opened_and_shown(e.info)[0]) for e in episodes], dtype=np.float64),
        "answered_first_opened": np.array([answer_source(e.info) == "first_opened" for e in episodes],
                                          dtype=np.float64),
        "copied_question": np.array([copies_question(str(e.info.get("answer") or ""), e.info.get("question", ""))
                                     for e in episodes], dtype=np.float64),
    }


def reward_part(episode, part: str) -> float:
    """One part of the episode's reward as the env broke it down (``info["reward"]``); 0 for an
    episode the rollout ended before the env scored it."""
    breakdown = episode.info.get("reward")
    return float(breakdown.get(part, 0.0)) if isinstance(breakdown, dict) else 0.0


def roc_auc(labels: Sequence[bool], scores: Sequence[float]) -> float:
    """P(score of a random positive > score of a random negative), ties counted half; NaN when
    either class is missing. labels, scores: (N,)."""
    y, x = np.asarray(labels, dtype=bool), np.asarray(scores, dtype=np.float64)
    pos, neg = x[y], x[~y]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def verdict_scores(episodes: Sequence, yes_id: int) -> list[tuple[bool, float]]:
    """(positive, π(yes)) of every verdict judged alone that the env counted (its candidate's label
    known): π(yes) from the verdict's log-prob, over the yes/no choices when constrained (greedy
    episodes keep it too), whichever token was chosen."""
    pairs = []
    for episode in episodes:
        for row in getattr(episode, "verdict_rows", None) or ():
            if row.positive is not None:
                pairs.append((row.positive, yes_prob(row.logprob, row.token_ids[-1] == yes_id)))
    return pairs


def verdict_ranking(pairs: Sequence[tuple[bool, float]]) -> dict[str, float]:
    """How the verdicts rank candidates, apart from where greedy decoding cuts (π(yes) > 0.5): the
    mean π(yes) of positives and of negatives, and the AUC of π(yes) for the labels."""
    labels, scores = [y for y, _ in pairs], [p for _, p in pairs]
    positives, negatives = [p for y, p in pairs if y], [p for y, p in pairs if not y]
    return {"verdicts": float(len(pairs)), "verdict_auc": roc_auc(labels, scores),
            "yes_prob_positive": float(np.mean(positives)) if positives else float("nan"),
            "yes_prob_negative": float(np.mean(negatives)) if negatives else float("nan")}


# each statistic and the per-question outcomes it reads: one key, its mean over questions; two keys
# (numerator, denominator), their pooled ratio (precision: positives opened / documents read; recall:
# positives opened / positives shown, as in envs.report); three keys (hits, selected,
# relevant), the pooled F1 of the selection (f1: the harmonic mean of the pooled precision and recall)
STATISTIC_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward",), "em": ("em",), "precision": ("positives_opened", "docs_read"),
    "recall": ("positives_opened", "positives_shown"), "f1": ("positives_opened", "docs_read", "positives_shown"),
    "docs": ("docs_read",), "selection": ("selection_reward",), "format": ("format_reward",),
    "reading": ("answered_first_opened", "opened_any"), "copy": ("copied_question",)}
_STATISTIC_KINDS: dict[int, Callable[..., Statistic]] = {1: mean_of, 2: pooled_ratio, 3: pooled_f1}
STATISTICS: dict[str, Statistic] = {name: _STATISTIC_KINDS[len(keys)](*keys) for name, keys in STATISTIC_KEYS.items()}


def statistics_of(*outcomes: dict[str, np.ndarray]) -> list[str]:
    """The names of :data:`STATISTICS` that every one of these outcome sets has the outcomes for."""
    return [name for name, keys in STATISTIC_KEYS.items() if all(key in o for o in outcomes for key in keys)]


def paired_bootstrap(before: dict[str, np.ndarray], after: dict[str, np.ndarray], statistic: str,
                     resamples: int = 2000, seed: int = 0, level: float = 0.95) -> PairedDifference:
    """:func:`envs.bootstrap.paired_bootstrap` of the named statistic of :data:`STATISTICS`."""
    return shared_paired_bootstrap(before, after, STATISTICS[statistic], resamples, seed, level)


def compare_runs(before: dict[str, np.ndarray], after: dict[str, np.ndarray], resamples: int = 2000,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    """:func:`paired_bootstrap` of every statistic in :data:`STATISTICS` both sides have outcomes for."""
    return {name: paired_bootstrap(before, after, name, resamples, seed).as_dict()
            for name in statistics_of(before, after)}


def result_line(comparison: dict[str, dict[str, float]]) -> str:
    """The trainer's machine-readable last line: reward and precision, then the selection profile
    (recall, selection F1 with its interval, documents read per question) where the evaluations have it."""
    r, p = comparison["reward"], comparison["precision"]
    line = (f"reward_before={r['before']:.4f} reward_after={r['after']:.4f} reward_diff_lo={r['lo']:.4f} "
            f"reward_diff_hi={r['hi']:.4f} precision_before={p['before']:.4f} precision_after={p['after']:.4f}")
    if all(name in comparison for name in ("recall", "f1", "docs")):
        c, f, d = comparison["recall"], comparison["f1"], comparison["docs"]
        line += (f" recall_before={c['before']:.4f} recall_after={c['after']:.4f} f1_before={f['before']:.4f} "
                 f"f1_after={f['after']:.4f} f1_diff_lo={f['lo']:.4f} f1_diff_hi={f['hi']:.4f} "
                 f"docs_before={d['before']:.4f} docs_after={d['after']:.4f}")
    return line


def gather_lists(accelerator, items: list) -> list:
    """Every process's ``items``, concatenated in process order; ``items`` itself on one process."""
    if accelerator is None or accelerator.num_processes <= 1:
        return items
    from accelerate.utils import gather_object

    return gather_object(items)


def gather_outcomes(accelerator, outcomes: dict[str, np.ndarray], indices: Sequence[int],
                    total: int) -> dict[str, np.ndarray]:
    """All processes' per-question outcomes in question order: each process evaluated the
    questions ``indices`` of ``total``; returns arrays (total,)."""
    rows = [(int(i), {k: float(outcomes[k][j]) for k in OUTCOME_KEYS}) for j, i in enumerate(indices)]
    merged = dict(gather_lists(accelerator, rows))
    if sorted(merged) != list(range(total)):
        raise RuntimeError(f"evaluation outcomes cover {len(merged)} of {total} questions")
    return {k: np.array([merged[i][k] for i in range(total)], dtype=np.float64) for k in OUTCOME_KEYS}
