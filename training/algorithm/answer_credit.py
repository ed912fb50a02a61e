"""The answer turn's own credit (``PPOConfig.answer_credit: answer``).

With an outcome estimator every model token of an episode takes the episode's advantage, the whole
reward's: the answer turn is then pushed by the selection term too. An episode that opened fewer
negatives is paid more whatever it answered, and its answer (which, having opened less, is more
often a title it never opened) is reinforced with it. With ``answer_credit: answer`` the answer
turn's tokens take instead the advantage of the answer term alone (EM × ``answer_weight``), by the
same estimator over the same groups; the query and the verdicts keep the episode's. So the answer
learns from whether it was right, and the verdicts from what they opened (``verdict_credit``).
"""
from __future__ import annotations

import torch

from training.algorithm.advantages import AdvantageBatch, compute_advantages
from training.config import OUTCOME_ESTIMATORS


def answer_turn_mask(episode) -> list[int]:
    """Per token, 1 on the model tokens of the turn that answered: the last model turn of an episode
    that ended by answering (``finish_reason == "answer"``); all 0 otherwise (action limit, context
    limit, an error, or a verdict row, which has no turns)."""
    mask, turns = list(episode.loss_mask), list(getattr(episode, "turn_ids", None) or ())
    if getattr(episode, "finish_reason", "") != "answer" or len(turns) != len(mask):
        return [0] * len(mask)
    model_turns = [turn for turn, m in zip(turns, mask) if m]
    if not model_turns:
        return [0] * len(mask)
    last = max(model_turns)
    return [int(bool(m) and turn == last) for turn, m in zip(turns, mask)]


def answer_term(episode) -> float:
    """The answer part of the episode's reward (``Episode.info["reward"]["answer"]``; 0 where the
    env gave no breakdown, e.g. a verdict row or an episode cut by the context limit)."""
    reward = (getattr(episode, "info", None) or {}).get("reward") or {}
    return float(reward.get("answer", 0.0))


@torch.no_grad()
def answer_turn_advantages(advantages: torch.Tensor, answer_mask: torch.Tensor, answer_reward: torch.Tensor,
                           group_ids: torch.Tensor, estimator: str, std_normalize: bool = True) -> torch.Tensor:
    """The episodes' advantages with the answer turn's tokens credited by the answer term alone.

    advantages, answer_mask: (E, T−1) episode rows; answer_reward, group_ids: (E,). ``estimator`` is
    an outcome estimator (:data:`OUTCOME_ESTIMATORS`), run over the answer terms with the answer
    turns as its mask: a_i = its advantage of A_i, e.g. (A_i − mean_g A)/(std_g A + eps) for grpo
    (0 in a group whose answers all scored the same). Returns (E, T−1): ``advantages`` off the
    answer turns, the answer term's advantage on them."""
    if estimator not in OUTCOME_ESTIMATORS:
        raise ValueError(f"answer_credit 'answer' needs an outcome estimator {OUTCOME_ESTIMATORS}, not {estimator!r}")
    answer_adv, _ = compute_advantages(estimator, AdvantageBatch(
        model_mask=answer_mask, scores=answer_reward.to(torch.float32), group_ids=group_ids,
        std_normalize=std_normalize))
    return torch.where(answer_mask > 0, answer_adv.to(advantages.dtype), advantages)


def with_answer_credit(algorithm, advantages: torch.Tensor, batch: dict[str, torch.Tensor], mask: torch.Tensor,
                       episodes: int) -> torch.Tensor:
    """:func:`answer_turn_advantages` on the batch's first ``episodes`` rows (the episodes; the
    verdict rows after them keep theirs), under the ``algorithm`` section's estimator
    (:class:`training.config.AlgorithmSettings`). advantages, mask: (B, T−1); ``batch`` from
    :func:`training.ppo_loop.ppo_batch.episodes_to_batch`. Returns (B, T−1)."""
    E = episodes
    out = advantages.clone()
    out[:E] = answer_turn_advantages(advantages[:E], batch["answer_mask"][:E] * mask[:E], batch["answer_reward"][:E],
                                     batch["group_id"][:E], algorithm.advantage, algorithm.grpo_std_normalize)
    return out
