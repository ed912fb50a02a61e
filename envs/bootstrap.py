"""The paired bootstrap of a difference between two runs on the same questions, and the plain
percentile bootstrap of one run's statistic; shared by PPO's before/after evaluation
(:mod:`training.evaluation.policy_eval`, :mod:`training.evaluation.curves`) and ``inference.evaluate --compare``.

Outcomes are per-question arrays (n,) keyed by name, both runs in the SAME question order. A
statistic maps ``(outcomes, rows)`` to one value per resample: rows (R, n) of question indices ->
(R,). Each resample draws n question indices with replacement, shared by both runs (that sharing
is what makes it paired: a question that is hard for both moves both runs together).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Outcomes = dict[str, np.ndarray]
Statistic = Callable[[Outcomes, np.ndarray], np.ndarray]

RESAMPLES = 2000
LEVEL = 0.95


def mean_of(key: str) -> Statistic:
    """The mean of ``outcomes[key]`` over each resample: rows (R, n) -> (R,)."""
    def statistic(outcomes: Outcomes, rows: np.ndarray) -> np.ndarray:
        return outcomes[key][rows].mean(axis=-1)
    return statistic


def pooled_ratio(numerator: str, denominator: str) -> Statistic:
    """Σ numerator / Σ denominator over each resample (0 where the denominator sums to 0): (R, n) -> (R,)."""
    def statistic(outcomes: Outcomes, rows: np.ndarray) -> np.ndarray:
        below = outcomes[denominator][rows].sum(axis=-1)
        above = outcomes[numerator][rows].sum(axis=-1)
        return np.divide(above, below, out=np.zeros_like(above, dtype=np.float64), where=below > 0)
    return statistic


def pooled_f1(hits: str, selected: str, relevant: str) -> Statistic:
    """The pooled F1 of a selection, 2·Σhits / (Σselected + Σrelevant) over each resample (the harmonic
    mean of pooled precision Σhits/Σselected and pooled recall Σhits/Σrelevant; 0 where both sums
    are 0): (R, n) -> (R,)."""
    def statistic(outcomes: Outcomes, rows: np.ndarray) -> np.ndarray:
        below = outcomes[selected][rows].sum(axis=-1) + outcomes[relevant][rows].sum(axis=-1)
        above = 2.0 * outcomes[hits][rows].sum(axis=-1)
        return np.divide(above, below, out=np.zeros_like(above, dtype=np.float64), where=below > 0)
    return statistic


def resample_rows(n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n) question indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central ``level`` interval of bootstrap values (R,)."""
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class PairedDifference:
    before: float
    after: float
    diff: float  # after − before on all questions
    lo: float  # 2.5th percentile of the bootstrap differences (at level 0.95)
    hi: float  # 97.5th percentile

    @property
    def significant(self) -> bool:
        """The interval excludes 0: the difference is unlikely to be resampling noise."""
        return self.lo > 0 or self.hi < 0

    def as_dict(self) -> dict[str, float]:
        return {"before": self.before, "after": self.after, "diff": self.diff, "lo": self.lo, "hi": self.hi}


def paired_bootstrap(before: Outcomes, after: Outcomes, statistic: Statistic, resamples: int = RESAMPLES,
                     seed: int = 0, level: float = LEVEL) -> PairedDifference:
    """Paired bootstrap interval of ``statistic(after) − statistic(before)``; both outcome dicts
    hold arrays (n,) over the same n > 0 questions in the same order."""
    sizes = {len(v) for v in (*before.values(), *after.values())}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"paired bootstrap needs the same non-empty question set (lengths {sorted(sizes)})")
    n = sizes.pop()
    everything = np.arange(n)[None]
    b, a = float(statistic(before, everything)[0]), float(statistic(after, everything)[0])
    rows = resample_rows(n, resamples, seed)
    lo, hi = percentile_interval(statistic(after, rows) - statistic(before, rows), level)
    return PairedDifference(b, a, a - b, lo, hi)


def bootstrap_interval(outcomes: Outcomes, statistic: Statistic, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of one run's statistic, questions resampled with replacement."""
    n = len(next(iter(outcomes.values())))
    return percentile_interval(statistic(outcomes, resample_rows(n, resamples, seed)), level)


def runs_and_questions_rows(runs: int, n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, runs, n) indices into ``runs`` runs' outcomes laid end to end (run r's question q at
    r·n + q): each resample draws ``runs`` runs with replacement and ONE set of n questions with
    replacement, shared by the runs drawn (the runs answered the same questions)."""
    rng = np.random.default_rng(seed)
    chosen_runs = rng.integers(0, runs, size=(resamples, runs))  # (B, R)
    questions = rng.integers(0, n, size=(resamples, n))  # (B, n)
    return chosen_runs[:, :, None] * n + questions[:, None, :]


def mean_over_runs(statistic: Statistic, outcomes: Outcomes, rows: np.ndarray) -> np.ndarray:
    """Each run's own statistic, averaged over the runs: rows (B, R, n) -> (B,). A ratio such as
    selection precision stays per run, so a run that opened nothing counts as its 0 instead of
    vanishing from a pooled Σ/Σ."""
    resamples, runs, n = rows.shape
    return statistic(outcomes, rows.reshape(resamples * runs, n)).reshape(resamples, runs).mean(axis=1)


def multi_run_paired_bootstrap(befores: list[Outcomes], afters: list[Outcomes], statistic: Statistic,
                               resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> PairedDifference:
    """The change after − before over several runs (seeds) on the same n questions: the mean over
    runs of each run's statistic, with a two-level paired bootstrap interval: runs resampled with
    replacement (the spread between seeds), then questions (the spread between questions), the same
    draw for before and after. ``befores[r]``, ``afters[r]``: run r's outcome arrays (n,), every run
    in the same question order."""
    if not befores or len(befores) != len(afters):
        raise ValueError(f"need the same non-zero number of runs before and after ({len(befores)}, {len(afters)})")
    sizes = {len(v) for run in (*befores, *afters) for v in run.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every run must hold the same non-empty question set (lengths {sorted(sizes)})")
    n, runs = sizes.pop(), len(befores)
    before = {k: np.concatenate([run[k] for run in befores]) for k in befores[0]}
    after = {k: np.concatenate([run[k] for run in afters]) for k in afters[0]}
    everything = np.arange(runs * n).reshape(1, runs, n)
    b, a = (float(mean_over_runs(statistic, side, everything)[0]) for side in (before, after))
    rows = runs_and_questions_rows(runs, n, resamples, seed)
    diffs = mean_over_runs(statistic, after, rows) - mean_over_runs(statistic, before, rows)  # (B,)
    lo, hi = percentile_interval(diffs, level)
    return PairedDifference(b, a, a - b, lo, hi)
