"""Episode reward for SEEDS-R1: answer reward + evidence-selection bonus - format penalties.

Every weight lives in :class:`RewardConfig` (part of the env config).
"""
from __future__ import annotations

from dataclasses import dataclass

from envs.metrics import answer_bearing, exact_match, f1_score, normalize_answer
from envs.types import Hit, QAExample


@dataclass(frozen=True)
class RewardConfig:
    answer_metric: str = "em"  # "em" or "f1"
    answer_weight: float = 1.0  # weight of the answer's EM (or F1) in the reward
    positive_opened_bonus: float = 0.1  # alpha: per positive passage opened
    negative_opened_penalty: float = 0.05  # beta: per negative passage opened
    missed_positive_penalty: float = 0.05  # gamma: per visible, unopened positive, only if the answer is wrong
    format_penalty: float = 0.1  # per invalid action

    def __post_init__(self) -> None:
        if self.answer_metric not in ("em", "f1"):
            raise ValueError(f"answer_metric must be 'em' or 'f1', not {self.answer_metric!r}")


def is_positive(hit: Hit, example: QAExample) -> bool:
    """Labelled positives (passage ids or supporting titles) when the example has them,
    otherwise the answer-bearing proxy (a normalised gold alias inside the passage text)."""
    if example.positive_ids or example.positive_titles:
        if hit.id in example.positive_ids:
            return True
        title = normalize_answer(hit.title)
        return any(title == normalize_answer(t) for t in example.positive_titles)
    return answer_bearing(hit.text, example.golden_answers)


def answer_reward(prediction: str | None, golds: tuple[str, ...], config: RewardConfig) -> float:
    """``answer_weight * EM`` (or F1) of the final answer; 0 without an answer."""
    if prediction is None:
        return 0.0
    score = exact_match(prediction, golds) if config.answer_metric == "em" else f1_score(prediction, golds)
    return config.answer_weight * score


def selection_reward(
    positives_opened: int, negatives_opened: int, positives_missed: int, answer_correct: bool, config: RewardConfig
) -> float:
    """alpha * opened positives - beta * opened negatives - gamma * missed positives (wrong answers only)."""
    bonus = config.positive_opened_bonus * positives_opened - config.negative_opened_penalty * negatives_opened
    if not answer_correct:
        bonus -= config.missed_positive_penalty * positives_missed
    return bonus


def verdict_reward_gap(opened: bool, positive: bool, answer_correct: bool, config: RewardConfig) -> float:
    """r(chosen) − r(other) for ONE judged candidate: its own term of :func:`selection_reward`
    under the verdict taken minus under the other verdict (open: +alpha if positive else −beta;
    skip: −gamma if positive and the answer is wrong, else 0)."""
    open_value = config.positive_opened_bonus if positive else -config.negative_opened_penalty
    skip_value = -config.missed_positive_penalty if positive and not answer_correct else 0.0
    return (open_value - skip_value) if opened else (skip_value - open_value)
