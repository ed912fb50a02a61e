"""Policy losses beside PPO's per-token clipped surrogate (:func:`training.algorithm.ppo_core.policy_loss_terms`).

Notation as in :mod:`training.algorithm.ppo_core` (B rows, T token positions, mask (B, T) 1 on model tokens).
Each loss has PPO's return shape: a per-token loss (B, T), unmasked, reduced by
:func:`training.algorithm.ppo_core.aggregate_loss`, and a dict of detached stats (clip_frac, dual_clip_frac,
approx_kl, ratio_max), so the trainer swaps one for the other (``PPOConfig.policy_loss``).
"""
from __future__ import annotations

import torch

from training.algorithm.ppo_core import LOG_RATIO_CLAMP, _as, masked_mean


def gspo_loss_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), in its GSPO-token form.

    logp, old_logp, advantages, mask: (B, T) -> loss (B, T), stats.
        s_i     = Σ_t m·(logp − old_logp) / Σ_t m                (the length-normalised sequence log ratio;
                                                                   each token's log ratio clamped to ±20)
        ρ_{i,t} = exp(sg[s_i] + logp_t − sg[logp_t])              (value exp(s_i) at every token of row i,
                                                                   gradient ρ_i·∇logp_t per token)
        L_t     = max(−A_t·ρ_{i,t}, −A_t·clip(ρ_{i,t}, 1 − clip_low, 1 + clip_high))
    ρ is one value per row, so the clip acts per sequence: a row whose ratio left the range (on the
    side its advantage pushes) gives no gradient at any of its tokens. With a per-row advantage and
    ``loss_agg: seq_mean_token_mean`` this is GSPO's objective; its paper's clip range is 3e-4 / 4e-4.
    No dual clip. stats (detached, means over this mask): clip_frac (tokens whose clipped branch is
    strictly larger), dual_clip_frac (0), approx_kl = mean((r − 1) − log r) of the per-token ratios
    r = exp(logp − old_logp) (k3 of KL(old‖new), as PPO's), ratio_max (the largest sequence ratio).
    """
    m = _as(mask, logp)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = (log_ratio * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
    live = torch.where(m > 0, logp, torch.zeros_like(logp))  # off the mask: no −inf − (−inf)
    ratio = torch.exp(seq_log_ratio.detach() + live - live.detach())  # (B, T)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        token_ratio = torch.exp(log_ratio)
        stats = {
            "clip_frac": masked_mean((loss_clipped > loss_unclipped).to(loss.dtype), mask),
            "dual_clip_frac": torch.zeros((), dtype=loss.dtype, device=loss.device),
            "approx_kl": masked_mean(token_ratio - 1.0 - log_ratio, mask),
            "ratio_max": torch.where(mask.bool(), ratio, torch.zeros_like(ratio)).max(),
        }
    return loss, stats
