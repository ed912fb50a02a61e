"""Greedy evaluation of the policy on held-out questions, and the paired bootstrap of a change.

The trainer evaluates the policy before and after PPO on the same questions with the same env
seeds (same candidates, same shuffled order), so each question gives a PAIRED outcome. The
difference after − before is reported with a paired bootstrap 95% interval: questions are
resampled with replacement (the same resample for both runs) and the statistic recomputed.

Per-question outcomes (:func:`question_outcomes`) are the episode's reward, EM, positives opened
and documents read; the statistics are the mean reward, the mean EM and the POOLED selection
precision (positives opened / documents opened over the resampled questions, as
:func:`training.rollout.rollout_stats` pools it).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

OUTCOME_KEYS = ("reward", "em", "positives_opened", "docs_read")


def question_outcomes(episodes: Sequence) -> dict[str, np.ndarray]:
    """Per-episode arrays (n,) of :data:`OUTCOME_KEYS` from rollout episodes."""
    return {
        "reward": np.array([e.reward for e in episodes], dtype=np.float64),
        "em": np.array([e.info.get("metrics", {}).get("em", 0.0) for e in episodes], dtype=np.float64),
        "positives_opened": np.array([e.info.get("positives_opened", 0) for e in episodes], dtype=np.float64),
        "docs_read": np.array([e.info.get("docs_read", 0) for e in episodes], dtype=np.float64),
    }


def mean_reward(outcomes: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Mean reward over each resample: rows (R, n) question indices -> (R,)."""
    return outcomes["reward"][rows].mean(axis=-1)


def mean_em(outcomes: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Mean exact match over each resample: rows (R, n) -> (R,)."""
    return outcomes["em"][rows].mean(axis=-1)


def pooled_precision(outcomes: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Positives opened / documents opened over each resample (0 when nothing opened): (R, n) -> (R,)."""
    opened = outcomes["docs_read"][rows].sum(axis=-1)
    positives = outcomes["positives_opened"][rows].sum(axis=-1)
    return np.divide(positives, opened, out=np.zeros_like(positives), where=opened > 0)


STATISTICS: dict[str, Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]] = {
    "reward": mean_reward, "em": mean_em, "precision": pooled_precision}


@dataclass(frozen=True)
class PairedDifference:
    before: float
    after: float
    diff: float  # after − before on all questions
    lo: float  # 2.5th percentile of the bootstrap differences
    hi: float  # 97.5th percentile

    def as_dict(self) -> dict[str, float]:
        return {"before": self.before, "after": self.after, "diff": self.diff, "lo": self.lo, "hi": self.hi}


def paired_bootstrap(before: dict[str, np.ndarray], after: dict[str, np.ndarray], statistic: str,
                     resamples: int = 2000, seed: int = 0, level: float = 0.95) -> PairedDifference:
    """Paired bootstrap interval of ``statistic(after) − statistic(before)``.

    before/after: per-question outcome arrays (n,) in the SAME question order. Each of the
    ``resamples`` draws n question indices with replacement, shared by both runs.
    """
    n = len(before["reward"])
    if n == 0 or len(after["reward"]) != n:
        raise ValueError(f"paired bootstrap needs the same non-empty question set ({n} vs {len(after['reward'])})")
    fn = STATISTICS[statistic]
    everything = np.arange(n)[None]
    b, a = float(fn(before, everything)[0]), float(fn(after, everything)[0])
    rows = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    diffs = fn(after, rows) - fn(before, rows)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return PairedDifference(b, a, a - b, float(lo), float(hi))


def compare_runs(before: dict[str, np.ndarray], after: dict[str, np.ndarray], resamples: int = 2000,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    """:func:`paired_bootstrap` of every statistic in :data:`STATISTICS`."""
    return {name: paired_bootstrap(before, after, name, resamples, seed).as_dict() for name in STATISTICS}


def result_line(comparison: dict[str, dict[str, float]]) -> str:
    """The trainer's machine-readable last line."""
    r, p = comparison["reward"], comparison["precision"]
    return (f"reward_before={r['before']:.4f} reward_after={r['after']:.4f} reward_diff_lo={r['lo']:.4f} "
            f"reward_diff_hi={r['hi']:.4f} precision_before={p['before']:.4f} precision_after={p['after']:.4f}")


def gather_outcomes(accelerator, outcomes: dict[str, np.ndarray], indices: Sequence[int],
                    total: int) -> dict[str, np.ndarray]:
    """All processes' per-question outcomes in question order: each process evaluated the
    questions ``indices`` of ``total``; returns arrays (total,)."""
    rows = [(int(i), {k: float(outcomes[k][j]) for k in OUTCOME_KEYS}) for j, i in enumerate(indices)]
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    merged = dict(rows)
    if sorted(merged) != list(range(total)):
        raise RuntimeError(f"evaluation outcomes cover {len(merged)} of {total} questions")
    return {k: np.array([merged[i][k] for i in range(total)], dtype=np.float64) for k in OUTCOME_KEYS}
