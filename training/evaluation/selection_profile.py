"""Whether a PPO run learnt to CHOOSE evidence, not to stop reading: the selection profile of the
SEEDS paper (§E.4, Fig. 7) as checkable targets.

A reward that rises because the policy opens nothing is a failed run, whatever the reward's
interval says. The targets read a before/after comparison, one run's (``eval.json``'s
``comparison``, :func:`training.evaluation.policy_eval.compare_runs`) or several runs' pooled by
:mod:`training.seed_spread`, each statistic a ``{"before", "after", "diff", "lo", "hi"}`` row:

- recall after PPO at least ``min_recall`` and no more than ``max_recall_drop`` below recall before
  (positives opened / positives shown: the policy keeps opening what it should);
- precision gain at least ``min_precision_gain``, its interval above 0 (it opens fewer negatives);
- selection F1's gain with its interval above 0 (the two together, pooled);
- documents read per question after PPO within ``docs_read`` (the paper reads about 2);
- EM's gain with its lower bound at least ``min_em_diff_lo`` (the answers do not get worse);
- answers that copy the question at most ``max_copy``, before and after.

:func:`selection_misses` lists the targets a comparison misses (empty: it meets all of them); a
statistic the comparison lacks (an ``eval.json`` written before it was recorded) is a miss that says so.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Comparison = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class SelectionTargets:
    """The selection profile a run must show (defaults: the embedded default's targets)."""

    min_recall: float = 0.70  # recall after PPO at least this
    max_recall_drop: float = 0.05  # ... and at least recall before − this
    min_precision_gain: float = 0.10  # precision after − before at least this, its interval above 0
    docs_read: tuple[float, float] = (1.0, 3.0)  # documents read per question after PPO within [low, high]
    min_em_diff_lo: float = -0.02  # the lower bound of EM's change at least this
    max_copy: float = 0.05  # share of answers copying the question, before and after, at most this


def _row(comparison: Comparison, name: str, misses: list[str]) -> Mapping[str, float] | None:
    row = comparison.get(name)
    if row is None:
        misses.append(f"{name}: not recorded in this comparison")
    return row


def recall_misses(comparison: Comparison, targets: SelectionTargets) -> list[str]:
    misses: list[str] = []
    row = _row(comparison, "recall", misses)
    if row is not None:
        if row["after"] < targets.min_recall:
            misses.append(f"recall after {row['after']:.3f} < {targets.min_recall:.2f}")
        if row["after"] < row["before"] - targets.max_recall_drop:
            misses.append(f"recall fell {row['before']:.3f} -> {row['after']:.3f}, more than "
                          f"{targets.max_recall_drop:.2f}")
    return misses


def precision_and_f1_misses(comparison: Comparison, targets: SelectionTargets) -> list[str]:
    misses: list[str] = []
    row = _row(comparison, "precision", misses)
    if row is not None:
        if row["diff"] < targets.min_precision_gain:
            misses.append(f"precision gain {row['diff']:+.3f} < +{targets.min_precision_gain:.2f}")
        if row["lo"] <= 0:
            misses.append(f"precision gain's interval [{row['lo']:+.3f}, {row['hi']:+.3f}] not above 0")
    row = _row(comparison, "f1", misses)
    if row is not None and row["lo"] <= 0:
        misses.append(f"selection F1 {row['before']:.3f} -> {row['after']:.3f}: interval of the gain "
                      f"[{row['lo']:+.3f}, {row['hi']:+.3f}] not above 0")
    return misses


def reading_and_answer_misses(comparison: Comparison, targets: SelectionTargets) -> list[str]:
    misses: list[str] = []
    row = _row(comparison, "docs", misses)
    low, high = targets.docs_read
    if row is not None and not low <= row["after"] <= high:
        misses.append(f"documents read per question after {row['after']:.2f} outside [{low:g}, {high:g}]")
    row = _row(comparison, "em", misses)
    if row is not None and row["lo"] < targets.min_em_diff_lo:
        misses.append(f"EM change's lower bound {row['lo']:+.3f} < {targets.min_em_diff_lo:+.2f}")
    row = _row(comparison, "copy", misses)
    if row is not None:
        for side in ("before", "after"):
            if row[side] > targets.max_copy:
                misses.append(f"answers copying the question {side} {row[side]:.3f} > {targets.max_copy:.2f}")
    return misses


def selection_misses(comparison: Comparison, targets: SelectionTargets | None = None) -> list[str]:
    """The targets ``comparison`` misses, one line each; an empty list: it meets every target."""
    targets = targets or SelectionTargets()
    return (recall_misses(comparison, targets) + precision_and_f1_misses(comparison, targets)
            + reading_and_answer_misses(comparison, targets))


def selection_verdict(comparison: Comparison, targets: SelectionTargets | None = None) -> str:
    """One printable line: the profile met, or what it missed."""
    misses = selection_misses(comparison, targets)
    if not misses:
        return "selection profile: meets every target (recall, precision, F1, documents read, EM, copies)"
    return f"selection profile: misses {len(misses)} target(s): " + "; ".join(misses)
