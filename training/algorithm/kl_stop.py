"""Early stop of an update's optimizer steps on the policy's KL to its rollout policy (``target_kl``).

PPO's clip bounds each token's ratio in the loss, not how far Adam moves the weights in
``ppo_epochs × mini_batches`` steps: with a large learning rate the steps can overshoot along a
direction every row shares (experiments/seeds_r1_runs.md, "What collapses is the step, not the
credit": one update at lr 1e-3 took π(yes) from 0.30 to 0.06 for every candidate). ``target_kl``
(CleanRL, Stable-Baselines3) measures, in each mini-batch's own forward pass before its step, k3 of
KL(old ‖ current) over that mini-batch's model tokens, and ends the update after the step of the
first mini-batch where it exceeds the target. Verdict tokens (``choice_mask``: a one-token yes/no
choice) and the rest of the model's tokens are measured apart, since the ~100 one-token verdicts of
a batch would vanish in the mean over its ~1,000 text tokens; either one past the target stops.
"""
from __future__ import annotations

import math

import torch


def approx_kl_sums(logp: torch.Tensor, old_logp: torch.Tensor, model_mask: torch.Tensor,
                   choice_mask: torch.Tensor) -> torch.Tensor:
    """Sums of k3 = (ρ − 1) − log ρ, ρ = exp(logp − old_logp), by token kind.

    logp, old_logp, model_mask, choice_mask: (B, T) -> (4,): [k3 summed over text tokens (model
    tokens that are not choices), their count, k3 summed over choice tokens, their count].
    """
    log_ratio = (logp - old_logp).float().clamp(-20.0, 20.0)
    k3 = torch.exp(log_ratio) - 1.0 - log_ratio
    choice = model_mask.float() * choice_mask.float()
    text = model_mask.float() - choice
    return torch.stack([(k3 * text).sum(), text.sum(), (k3 * choice).sum(), choice.sum()])


def kl_means(sums: torch.Tensor) -> tuple[float, float]:
    """(text KL, choice KL) means from :func:`approx_kl_sums` totals (4,); NaN for a kind with no tokens."""
    text_sum, text_count, choice_sum, choice_count = (float(x) for x in sums)
    return (text_sum / text_count if text_count else math.nan,
            choice_sum / choice_count if choice_count else math.nan)


def global_kl_sums(sums: torch.Tensor, accelerator=None) -> torch.Tensor:
    """:func:`approx_kl_sums` totals (4,) summed over all processes, so that every process takes the
    same stop decision."""
    if accelerator is None or accelerator.num_processes == 1:
        return sums
    return accelerator.reduce(sums.to(accelerator.device), reduction="sum")


def exceeds_target_kl(global_sums: torch.Tensor, target_kl: float | None) -> bool:
    """Whether a mini-batch's text or choice KL (from global :func:`approx_kl_sums` totals) is past
    ``target_kl`` (None: never)."""
    if target_kl is None:
        return False
    return any(kl > target_kl for kl in kl_means(global_sums) if not math.isnan(kl))


def kl_summary(step_sums: list[torch.Tensor]) -> dict[str, float]:
    """An update's KL figures from each mini-batch's global :func:`approx_kl_sums` (4,): the means over
    all the steps taken (``approx_kl_text``, ``approx_kl_verdicts``) and the largest mini-batch mean
    (``…_max``, what ``target_kl`` is compared with); NaN where there was no step or no such token."""
    if not step_sums:
        return dict.fromkeys(("approx_kl_text", "approx_kl_verdicts", "approx_kl_text_max",
                              "approx_kl_verdicts_max"), math.nan)
    text, verdicts = kl_means(torch.stack(step_sums).sum(0))
    per_step = [kl_means(sums) for sums in step_sums]
    largest = [max((kl[i] for kl in per_step if not math.isnan(kl[i])), default=math.nan) for i in (0, 1)]
    return {"approx_kl_text": text, "approx_kl_verdicts": verdicts, "approx_kl_text_max": largest[0],
            "approx_kl_verdicts_max": largest[1]}
