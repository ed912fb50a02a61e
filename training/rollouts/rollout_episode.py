"""The rollout's unit, :class:`Episode` (one flat token list with its parallel arrays: see
:mod:`training.rollouts.rollout`), and :func:`rollout_stats`, the batch metrics logged for a list of them."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.report import summarize_episodes
from training.rollouts.rollout_judge import VerdictRow

FINISH_REASONS = ("answer", "action_limit", "context_limit", "empty_answer", "error")


@dataclass
class Episode:
    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    turn_ids: list[int]
    prompt_length: int
    example_id: str
    group_id: int
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    finish_reason: str = ""
    text: str = ""
    # 1 where the model token was a constrained choice among the verdict tokens (judgement form,
    # RolloutConfig.constrain_verdicts): its log-prob is over those choices only. Empty: none.
    choice_mask: list[int] = field(default_factory=list)
    # per token: at an accepted verdict, r(chosen) − r(other) of its candidate's own selection term
    # (envs.rewards.verdict_reward_gap), 0 elsewhere; the trainer's verdict_credit. Empty: none.
    choice_reward_gap: list[float] = field(default_factory=list)
    # judge_context "alone": the verdicts judged in contexts of their own (rows of their own in training)
    verdict_rows: list[VerdictRow] = field(default_factory=list)
    # (n, H): the rollout's hidden states after the frozen layers, positions 0..n-1 (record_states_after)
    frozen_states: Any = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        n = len(self.token_ids)
        assert len(self.loss_mask) == n and len(self.sampler_logprobs) == n and len(self.turn_ids) == n, (
            f"parallel arrays differ: {n} ids, {len(self.loss_mask)} mask, {len(self.sampler_logprobs)} logprobs, "
            f"{len(self.turn_ids)} turn ids")
        assert not self.choice_mask or len(self.choice_mask) == n, "choice_mask differs in length from token_ids"
        assert not self.choice_reward_gap or len(self.choice_reward_gap) == n, "choice_reward_gap differs in length"
        assert 0 <= self.prompt_length <= n

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        return max(self.turn_ids, default=-1) + 1


# ------------------------------------------------------------------------------ statistics

def rollout_stats(episodes: Sequence[Episode]) -> dict[str, float]:
    """Batch metrics for logging: :func:`envs.report.summarize_episodes` of the episodes' env
    summaries (the one summary every consumer reports; selection figures pooled), plus the token
    counts and the share of each finish reason."""
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}
    stats = summarize_episodes([{**e.info, "reward": e.reward} for e in episodes])
    stats["model_tokens_mean"] = sum(e.num_model_tokens for e in episodes) / n
    stats["episode_tokens_mean"] = sum(len(e.token_ids) for e in episodes) / n
    reasons = Counter(e.finish_reason for e in episodes)
    for reason in FINISH_REASONS:
        stats[f"finish/{reason}"] = reasons.get(reason, 0) / n
    return stats
